// The shm backend's all_gather variants.

#include "backends/shm/shm_backend.h"

namespace ddp::shm_backend {

void ShmBackend::all_gather(const void* in, void* out, std::size_t count, DType dtype) {
  guarded([&] {
    if (count == 0) return;
    if (!single_node()) return fallback().all_gather(in, out, count, dtype);
    const Algorithm a =
        algorithm_for_call(Collective::kAllGather, count * dtype_size(dtype), dtype, -1, -1);
    run_all_gather(a, in, out, count, dtype, false);
  });
}

void ShmBackend::run_all_gather(Algorithm a, const void* in, void* out, std::size_t count,
                                DType dtype, bool timing) {
  const std::size_t bytes = count * dtype_size(dtype), chunk = segment().geometry().chunk_bytes;
  Descriptor d = descriptor(Kind::kAllGather, dtype, bytes, -1, -1, a, timing);
  d.offset = segment().offset_of(out, bytes * static_cast<std::size_t>(local_size_));
  d.input_offset = segment().offset_of(in, bytes);
  begin(d);  // which variant can run depends on where every buffer lives, known once all published
  auto* src = static_cast<const char*>(in);
  auto* dst = static_cast<char*>(out);
  const Algorithm run = runnable(a, all_in_segment(&Descriptor::input_offset), all_in_segment());
  if (run == Algorithm::kPull) {
    for (int k = 0; k < local_size_; ++k) {
      char* to = dst + static_cast<std::size_t>(k) * bytes;
      const char* from = segment().base() + published(k).input_offset;
      if (to != from) std::memmove(to, from, bytes);
    }
    sync_->phase(deadline_);  // nobody returns (and lets its caller change its input) before all
                              // have read it
    return;
  }
  if (run == Algorithm::kPush) {
    for (int k = 0; k < local_size_; ++k) {
      char* to = segment().base() + published(k).offset + static_cast<std::size_t>(me_) * bytes;
      if (to != src) std::memmove(to, src, bytes);
    }
    sync_->phase(deadline_);  // nobody reads its output before all wrote it
    return;
  }
  for (std::size_t b = 0; b < bytes; b += chunk) {
    const std::size_t len = std::min(chunk, bytes - b);
    const unsigned parity = chunk_parity_++;
    std::memcpy(segment().chunk_slot(me_, parity), src + b, len);
    sync_->phase(deadline_);
    for (int k = 0; k < local_size_; ++k) {
      char* to = dst + static_cast<std::size_t>(k) * bytes + b;
      const char* from = k == me_ ? src + b : segment().chunk_slot(k, parity);
      if (to != from) std::memmove(to, from, len);
    }
  }
}

}  // namespace ddp::shm_backend
