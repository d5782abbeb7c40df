// The shm backend's broadcast variants.

#include "backends/shm/variants.h"

#include <cstring>

namespace ddp::shm {
namespace {

// Broadcast through the root's double-buffered chunk slots; `first`, when
// given, is published with the first chunk's phase.
void chunked_broadcast(Context& ctx, char* p, std::size_t bytes, int root,
                       const Descriptor* first) {
  const std::size_t chunk = ctx.segment->geometry().chunk_bytes;
  for (std::size_t b = 0; b < bytes; b += chunk) {
    const std::size_t len = std::min(chunk, bytes - b);
    char* slot = ctx.segment->chunk_slot(root, ctx.chunk_parity++);
    if (ctx.me == root) std::memcpy(slot, p + b, len);
    if (first != nullptr) {
      ctx.begin(*first);
      first = nullptr;
    } else {
      ctx.phase();
    }
    if (ctx.me != root) std::memcpy(p + b, slot, len);
  }
}

}  // namespace

void broadcast(Context& ctx, Algorithm a, void* data, std::size_t count, DType dtype, int root,
               bool timing) {
  const std::size_t bytes = count * dtype_size(dtype);
  Descriptor d = ctx.descriptor(Collective::kBroadcast, dtype, bytes, root, -1, a, timing);
  d.offset = ctx.segment->offset_of(data, bytes);
  auto* p = static_cast<char*>(data);
  if (a != Algorithm::kPush && a != Algorithm::kPull)
    return chunked_broadcast(ctx, p, bytes, root, &d);
  ctx.begin(
      d);  // which variant can run depends on where every buffer lives, known once all published
  bool others_in_segment = true;
  for (int k = 0; k < ctx.local_size; ++k) {
    if (k != root && ctx.published(k).offset < 0) others_in_segment = false;
  }
  const Algorithm run = runnable(a, ctx.published(root).offset >= 0, others_in_segment);
  if (run == Algorithm::kChunked) return chunked_broadcast(ctx, p, bytes, root, nullptr);
  if (run == Algorithm::kPull && ctx.me != root) {
    const char* from = ctx.segment->base() + ctx.published(root).offset;
    if (from != p) std::memcpy(p, from, bytes);
  }
  if (run == Algorithm::kPush && ctx.me == root) {
    for (int k = 0; k < ctx.local_size; ++k) {
      char* to = ctx.segment->base() + ctx.published(k).offset;
      if (k != root && to != p) std::memcpy(to, p, bytes);
    }
  }
  ctx.phase();  // pull: the root keeps its buffer until all have read it; push: all are written
}

}  // namespace ddp::shm
