// The shm backend's all_gather variants.

#include "backends/shm/variants.h"

#include <cstring>

namespace ddp::shm {

void all_gather(Context& ctx, Algorithm a, const void* in, void* out, std::size_t count,
                DType dtype, bool timing) {
  const std::size_t bytes = count * dtype_size(dtype), chunk = ctx.segment->geometry().chunk_bytes;
  Descriptor d = ctx.descriptor(Collective::kAllGather, dtype, bytes, -1, -1, a, timing);
  d.offset = ctx.segment->offset_of(out, bytes * static_cast<std::size_t>(ctx.local_size));
  d.input_offset = ctx.segment->offset_of(in, bytes);
  ctx.begin(
      d);  // which variant can run depends on where every buffer lives, known once all published
  auto* src = static_cast<const char*>(in);
  auto* dst = static_cast<char*>(out);
  const Algorithm run =
      runnable(a, ctx.all_in_segment(&Descriptor::input_offset), ctx.all_in_segment());
  if (run == Algorithm::kPull) {
    for (int k = 0; k < ctx.local_size; ++k) {
      char* to = dst + static_cast<std::size_t>(k) * bytes;
      const char* from = ctx.segment->base() + ctx.published(k).input_offset;
      if (to != from) std::memmove(to, from, bytes);
    }
    ctx.phase();  // nobody returns (and lets its caller change its input) before all
                  // have read it
    return;
  }
  if (run == Algorithm::kPush) {
    for (int k = 0; k < ctx.local_size; ++k) {
      char* to =
          ctx.segment->base() + ctx.published(k).offset + static_cast<std::size_t>(ctx.me) * bytes;
      if (to != src) std::memmove(to, src, bytes);
    }
    ctx.phase();  // nobody reads its output before all wrote it
    return;
  }
  for (std::size_t b = 0; b < bytes; b += chunk) {
    const std::size_t len = std::min(chunk, bytes - b);
    const unsigned parity = ctx.chunk_parity++;
    std::memcpy(ctx.segment->chunk_slot(ctx.me, parity), src + b, len);
    ctx.phase();
    for (int k = 0; k < ctx.local_size; ++k) {
      char* to = dst + static_cast<std::size_t>(k) * bytes + b;
      const char* from = k == ctx.me ? src + b : ctx.segment->chunk_slot(k, parity);
      if (to != from) std::memmove(to, from, len);
    }
  }
}

}  // namespace ddp::shm
