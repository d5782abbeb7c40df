// The shm backend's reduce_scatter variants.

#include "backends/shm/shm_backend.h"

namespace ddp::shm_backend {

void ShmBackend::reduce_scatter(const void* in, void* out, std::size_t count, DType dtype,
                                ReduceOp op) {
  guarded([&] {
    if (count == 0) return;
    if (!single_node()) return fallback().reduce_scatter(in, out, count, dtype, op);
    const Algorithm a = algorithm_for_call(Collective::kReduceScatter, count * dtype_size(dtype),
                                           dtype, static_cast<std::int32_t>(op), -1);
    run_reduce_scatter(a, in, out, count, dtype, op, false);
  });
}

void ShmBackend::run_reduce_scatter(Algorithm a, const void* in, void* out, std::size_t count,
                                    DType dtype, ReduceOp op, bool timing) {
  const std::size_t element = dtype_size(dtype), bytes = count * element;
  Descriptor d =
      descriptor(Kind::kReduceScatter, dtype, bytes, -1, static_cast<std::int32_t>(op), a, timing);
  d.offset = segment().offset_of(in, bytes * static_cast<std::size_t>(local_size_));
  begin(d);  // which variant can run depends on where every rank's input lives, known once all
             // published
  auto* src = static_cast<const char*>(in);
  auto* dst = static_cast<char*>(out);
  const std::size_t mine = static_cast<std::size_t>(me_) * bytes;
  if (a == Algorithm::kPull && all_in_segment()) {
    const std::size_t block = std::max<std::size_t>(1, kFuseBytes / element);
    for (std::size_t o = 0; o < count; o += block) {
      const std::size_t n = std::min(block, count - o), at = mine + o * element;
      reduce_slice(
          dst + o * element, src + at,
          [&](int k) { return segment().base() + published(k).offset + at; }, n, dtype, op);
    }
    sync_->phase(
        deadline_);  // nobody returns (and lets its caller reuse `in`) before all have read it
    return;
  }
  // Each chunk slot holds, per destination rank, `per` elements of its block.
  const std::size_t per = std::max<std::size_t>(
      1, segment().geometry().chunk_bytes / (element * static_cast<std::size_t>(local_size_)));
  for (std::size_t b = 0; b < count; b += per) {
    const std::size_t m = std::min(per, count - b);
    const unsigned parity = chunk_parity_++;
    char* slot = segment().chunk_slot(me_, parity);
    for (int k = 0; k < local_size_; ++k) {
      if (k == me_) continue;
      std::memcpy(slot + static_cast<std::size_t>(k) * per * element,
                  src + (static_cast<std::size_t>(k) * count + b) * element, m * element);
    }
    sync_->phase(deadline_);
    const std::size_t at = static_cast<std::size_t>(me_) * per * element;
    reduce_slice(
        dst + b * element, src + mine + b * element,
        [&](int k) { return segment().chunk_slot(k, parity) + at; }, m, dtype, op);
  }
}

}  // namespace ddp::shm_backend
