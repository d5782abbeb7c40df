// The shm backend's broadcast variants.

#include "backends/shm/shm_backend.h"

namespace ddp::shm_backend {

void ShmBackend::broadcast(void* data, std::size_t count, DType dtype, int root) {
  guarded([&] {
    if (count == 0) return;
    if (!single_node()) return fallback().broadcast(data, count, dtype, root);
    const Algorithm a =
        algorithm_for_call(Collective::kBroadcast, count * dtype_size(dtype), dtype, -1, root);
    run_broadcast(a, data, count, dtype, root, false);
  });
}

void ShmBackend::run_broadcast(Algorithm a, void* data, std::size_t count, DType dtype, int root,
                               bool timing) {
  const std::size_t bytes = count * dtype_size(dtype);
  Descriptor d = descriptor(Kind::kBroadcast, dtype, bytes, root, -1, a, timing);
  d.offset = segment().offset_of(data, bytes);
  auto* p = static_cast<char*>(data);
  if (a != Algorithm::kPush && a != Algorithm::kPull) return chunked_broadcast(p, bytes, root, &d);
  begin(d);  // which variant can run depends on where every buffer lives, known once all published
  bool others_in_segment = true;
  for (int k = 0; k < local_size_; ++k) {
    if (k != root && published(k).offset < 0) others_in_segment = false;
  }
  const Algorithm run = runnable(a, published(root).offset >= 0, others_in_segment);
  if (run == Algorithm::kChunked) return chunked_broadcast(p, bytes, root, nullptr);
  if (run == Algorithm::kPull && me_ != root) {
    const char* from = segment().base() + published(root).offset;
    if (from != p) std::memcpy(p, from, bytes);
  }
  if (run == Algorithm::kPush && me_ == root) {
    for (int k = 0; k < local_size_; ++k) {
      char* to = segment().base() + published(k).offset;
      if (k != root && to != p) std::memcpy(to, p, bytes);
    }
  }
  sync_->phase(
      deadline_);  // pull: the root keeps its buffer until all have read it; push: all are written
}

void ShmBackend::chunked_broadcast(char* p, std::size_t bytes, int root, const Descriptor* first) {
  const std::size_t chunk = segment().geometry().chunk_bytes;
  for (std::size_t b = 0; b < bytes; b += chunk) {
    const std::size_t len = std::min(chunk, bytes - b);
    char* slot = segment().chunk_slot(root, chunk_parity_++);
    if (me_ == root) std::memcpy(slot, p + b, len);
    if (first != nullptr) {
      begin(*first);
      first = nullptr;
    } else {
      sync_->phase(deadline_);
    }
    if (me_ != root) std::memcpy(p + b, slot, len);
  }
}

}  // namespace ddp::shm_backend
