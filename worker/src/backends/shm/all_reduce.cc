// The shm backend's all_reduce (and reduce) variants: small, push, pull,
// chunked, and the in-place partial one.

#include "backends/shm/shm_backend.h"

namespace ddp::shm_backend {

void ShmBackend::all_reduce_impl(void* data, std::size_t count, DType dtype, ReduceOp op,
                                 const std::vector<ElementRange>* needed) {
  guarded([&] {
    if (count == 0) return;
    if (!state_ || (config_.nodes > 1 && !cross_)) {
      // One rank on this node (across nodes: Gloo among them), or nodes of different sizes.
      return state_ ? fallback().all_reduce(data, count, dtype, op)
                    : across().all_reduce(data, count, dtype, op);
    }
    const Algorithm a = algorithm_for_call(Collective::kAllReduce, count * dtype_size(dtype), dtype,
                                           static_cast<std::int32_t>(op), -1);
    run_all_reduce(a, data, count, dtype, op, needed, false);
  });
}

void ShmBackend::run_all_reduce(Algorithm a, void* data, std::size_t count, DType dtype,
                                ReduceOp op, const std::vector<ElementRange>* needed, bool timing) {
  const std::size_t bytes = count * dtype_size(dtype);
  Descriptor d =
      descriptor(Kind::kAllReduce, dtype, bytes, -1, static_cast<std::int32_t>(op), a, timing);
  if (a == Algorithm::kSmall && bytes <= segment().geometry().small_bytes && !cross_) {
    return small_all_reduce(data, count, dtype, op, d);
  }
  d.offset = segment().offset_of(data, bytes);
  begin(d);
  const bool in_place = (a == Algorithm::kPush || a == Algorithm::kPull) && all_in_segment();
  if (in_place && needed != nullptr && !cross_) return zero_copy_partial(count, dtype, op, *needed);
  if (in_place) return zero_copy_all_reduce(count, dtype, op, a == Algorithm::kPull && !cross_);
  chunked_reduce(static_cast<char*>(data), count, dtype, op, -1, nullptr);
}

void ShmBackend::small_all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op,
                                  const Descriptor& d) {
  const unsigned parity = small_parity_++;
  std::memcpy(segment().small_slot(me_, parity), data, d.bytes);
  begin(d);
  ReduceFn fn = reduce_function(dtype, op);
  fn(data, segment().small_slot(0, parity), segment().small_slot(1, parity), count);
  for (int k = 2; k < local_size_; ++k) fn(data, data, segment().small_slot(k, parity), count);
  if (op == ReduceOp::kAvg) divide_in_place(data, count, dtype, config_.size);
}

void ShmBackend::zero_copy_all_reduce(std::size_t count, DType dtype, ReduceOp op, bool pull) {
  const std::size_t element = dtype_size(dtype);
  char* base = segment().base();
  auto buffer = [&](int k) { return base + published(k).offset; };
  const Slice mine = slice_of(count, local_size_, me_, element);
  ReduceIntoBothFn both =
      local_size_ == 2 && !cross_ && !pull ? reduce_into_both_function(dtype, op) : nullptr;
  if (both != nullptr && mine.size() > 0) {
    // Two ranks: one pass reads both slices and writes the result to both.
    const std::size_t at = mine.lo * element;
    both(buffer(me_) + at, buffer(1 - me_) + at, mine.size(),
         op == ReduceOp::kAvg ? config_.size : 1);
    sync_->phase(deadline_);
    return;
  }
  const std::size_t block = cross_ ? mine.size() : std::max<std::size_t>(1, kFuseBytes / element);
  for (std::size_t o = mine.lo; o < mine.hi; o += block) {
    const std::size_t n = std::min(block, mine.hi - o), at = o * element;
    reduce_slice(
        buffer(me_) + at, buffer(me_) + at, [&](int k) { return buffer(k) + at; }, n, dtype, op);
    for (int k = 0; k < local_size_ && !pull; ++k) {
      if (k != me_) std::memcpy(buffer(k) + at, buffer(me_) + at, n * element);
    }
  }
  sync_->phase(deadline_);
  if (!pull) return;
  for (int k = 0; k < local_size_; ++k) {
    if (k == me_) continue;
    const Slice theirs = slice_of(count, local_size_, k, element);
    std::memcpy(buffer(me_) + theirs.lo * element, buffer(k) + theirs.lo * element,
                theirs.size() * element);
  }
  sync_->phase(deadline_);
}

void ShmBackend::zero_copy_partial(std::size_t count, DType dtype, ReduceOp op,
                                   const std::vector<ElementRange>& needed) {
  const std::size_t element = dtype_size(dtype);
  const std::size_t block = std::max<std::size_t>(1, kFuseBytes / element);
  char* base = segment().base();
  auto buffer = [&](int k) { return base + published(k).offset; };
  for (const ElementRange& range : needed) {
    for (int owner = 0; owner < local_size_; ++owner) {
      const Slice slice = slice_of(count, local_size_, owner, element);
      const std::size_t lo = std::max(range.begin, slice.lo), hi = std::min(range.end, slice.hi);
      for (std::size_t o = lo; o < hi; o += block) {
        const std::size_t n = std::min(block, hi - o), at = o * element;
        // Into this rank's buffer directly when its own value is read by
        // the first step (it is the owner, or the first rank after it; two
        // ranks: always); otherwise through an L1 block, so its value is
        // not overwritten before its turn in the order.
        const int first_other = owner == 0 ? 1 : 0;
        char* out = owner == me_ || first_other == me_ ? buffer(me_) + at : partial_block_.data();
        reduce_slice_from(
            owner, out, buffer(owner) + at, [&](int k) { return buffer(k) + at; }, n, dtype, op);
        if (out != buffer(me_) + at) std::memcpy(buffer(me_) + at, out, n * element);
      }
    }
  }
  sync_->phase(deadline_);
}

void ShmBackend::chunked_reduce(char* data, std::size_t count, DType dtype, ReduceOp op, int to,
                                const Descriptor* first) {
  if (to < 0 && first == nullptr && local_size_ == 2 && !cross_) {
    if (ReduceIntoBothFn both = reduce_into_both_function(dtype, op); both != nullptr) {
      return two_rank_chunked_all_reduce(data, count, dtype, op, both);
    }
  }
  const std::size_t element = dtype_size(dtype);
  const std::size_t per_chunk = segment().geometry().chunk_bytes / element;
  const bool receive = to < 0 || to == me_;
  for (std::size_t b = 0; b < count; b += per_chunk) {
    const std::size_t m = std::min(per_chunk, count - b);
    const unsigned parity = chunk_parity_++;
    char* src = data + b * element;
    char* slot = segment().chunk_slot(me_, parity);
    char* result = segment().result_slot(parity);
    const Slice mine = slice_of(m, local_size_, me_, element);
    std::memcpy(slot, src, mine.lo * element);
    std::memcpy(slot + mine.hi * element, src + mine.hi * element, (m - mine.hi) * element);
    if (first != nullptr) {
      begin(*first);
      first = nullptr;
    } else {
      sync_->phase(deadline_);
    }
    if (mine.size() > 0) {
      // In blocks that stay in L1 between the reduction and the copy back
      // (within a node; across nodes the slice goes to Gloo whole).
      const std::size_t block =
          cross_ ? mine.size() : std::max<std::size_t>(1, kFuseBytes / element);
      for (std::size_t o = mine.lo; o < mine.hi; o += block) {
        const std::size_t n = std::min(block, mine.hi - o), at = o * element;
        reduce_slice(
            result + at, src + at, [&](int k) { return segment().chunk_slot(k, parity) + at; }, n,
            dtype, op);
        if (receive) std::memcpy(src + at, result + at, n * element);
      }
    }
    sync_->phase(deadline_);
    if (!receive) continue;
    for (int k = 0; k < local_size_; ++k) {
      if (k == me_) continue;
      const Slice s = slice_of(m, local_size_, k, element);
      std::memcpy(src + s.lo * element, result + s.lo * element, s.size() * element);
    }
  }
}

void ShmBackend::two_rank_chunked_all_reduce(char* data, std::size_t count, DType dtype,
                                             ReduceOp op, ReduceIntoBothFn both) {
  const std::size_t element = dtype_size(dtype);
  const std::size_t per_chunk = segment().geometry().chunk_bytes / element;
  const std::size_t chunks = (count + per_chunk - 1) / per_chunk;
  const int divisor = op == ReduceOp::kAvg ? config_.size : 1;
  auto length = [&](std::size_t i) { return std::min(per_chunk, count - i * per_chunk); };
  auto copy_in = [&](std::size_t i, unsigned parity) {
    const Slice theirs = slice_of(length(i), 2, 1 - me_, element);
    std::memcpy(segment().chunk_slot(me_, parity) + theirs.lo * element,
                data + (i * per_chunk + theirs.lo) * element, theirs.size() * element);
    return sync_->arrive();
  };
  unsigned parity = chunk_parity_++;
  std::uint32_t copied = copy_in(0, parity);
  for (std::size_t i = 0; i < chunks; ++i) {
    char* chunk = data + i * per_chunk * element;
    const Slice mine = slice_of(length(i), 2, me_, element),
                theirs = slice_of(length(i), 2, 1 - me_, element);
    sync_->wait_all(copied,
                    deadline_);  // the peer's copy of this rank's half is in the peer's slot
    both(chunk + mine.lo * element, segment().chunk_slot(1 - me_, parity) + mine.lo * element,
         mine.size(), divisor);
    const std::uint32_t reduced = sync_->arrive();
    const unsigned next = i + 1 < chunks ? chunk_parity_++ : parity;
    if (i + 1 < chunks) copied = copy_in(i + 1, next);
    sync_->wait_all(reduced,
                    deadline_);  // the peer's result for the other half is in this rank's slot
    std::memcpy(chunk + theirs.lo * element,
                segment().chunk_slot(me_, parity) + theirs.lo * element, theirs.size() * element);
    parity = next;
  }
}

void ShmBackend::all_reduce_partial(void* data, std::size_t count, DType dtype, ReduceOp op,
                                    const std::vector<ElementRange>& needed) {
  all_reduce_impl(data, count, dtype, op, &needed);
}

void ShmBackend::reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) {
  guarded([&] {
    if (count == 0) return;
    if (!single_node()) return fallback().reduce(data, count, dtype, op, root);
    const Descriptor d = descriptor(Kind::kReduce, dtype, count * dtype_size(dtype), root,
                                    static_cast<std::int32_t>(op), Algorithm::kChunked, false);
    chunked_reduce(static_cast<char*>(data), count, dtype, op, root, &d);
  });
}

}  // namespace ddp::shm_backend
