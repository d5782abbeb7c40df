// The shm backend's all_reduce (and reduce) variants: small, push, pull,
// chunked, and the in-place partial one.

#include "backends/shm/variants.h"

#include <cstring>

namespace ddp::shm {
namespace {

// Up to small_bytes: one copy into this rank's slot, one phase, and every
// rank reduces all slots itself, in rank order (so all get the same bits).
void small_all_reduce(Context& ctx, void* data, std::size_t count, DType dtype, ReduceOp op,
                      const Descriptor& d) {
  const unsigned parity = ctx.small_parity++;
  std::memcpy(ctx.segment->small_slot(ctx.me, parity), data, d.bytes);
  ctx.begin(d);
  ReduceFn fn = reduce_function(dtype, op);
  fn(data, ctx.segment->small_slot(0, parity), ctx.segment->small_slot(1, parity), count);
  for (int k = 2; k < ctx.local_size; ++k)
    fn(data, data, ctx.segment->small_slot(k, parity), count);
  if (op == ReduceOp::kAvg) divide_in_place(data, count, dtype, ctx.size);
}

// Every buffer lives in the segment: each rank reduces its slice of all
// buffers and writes the result into every buffer at once, block by block
// (the block stays in L1 between the reduction and the copies). No rank
// reads or writes another's slice, so one phase at the end is all it takes:
// nobody returns (and lets its caller touch the buffer) before every slice
// of it has been written.
// `pull` (DDP_SHM_ALGO=pull): each rank writes its reduced slice only into
// its own buffer and, once every slice is reduced, copies the others' slices
// from their owners' buffers; nobody returns (and lets its caller change its
// buffer) before all have copied. Otherwise (push) it writes its slice into
// every rank's buffer.
void zero_copy_all_reduce(Context& ctx, std::size_t count, DType dtype, ReduceOp op, bool pull) {
  const std::size_t element = dtype_size(dtype);
  char* base = ctx.segment->base();
  auto buffer = [&](int k) { return base + ctx.published(k).offset; };
  const Slice mine = slice_of(count, ctx.local_size, ctx.me, element);
  ReduceIntoBothFn both =
      ctx.local_size == 2 && !ctx.cross && !pull ? reduce_into_both_function(dtype, op) : nullptr;
  if (both != nullptr && mine.size() > 0) {
    // Two ranks: one pass reads both slices and writes the result to both.
    const std::size_t at = mine.lo * element;
    both(buffer(ctx.me) + at, buffer(1 - ctx.me) + at, mine.size(),
         op == ReduceOp::kAvg ? ctx.size : 1);
    ctx.phase();
    return;
  }
  const std::size_t block =
      ctx.cross ? mine.size() : std::max<std::size_t>(1, kFuseBytes / element);
  for (std::size_t o = mine.lo; o < mine.hi; o += block) {
    const std::size_t n = std::min(block, mine.hi - o), at = o * element;
    ctx.reduce_slice(
        buffer(ctx.me) + at, buffer(ctx.me) + at, [&](int k) { return buffer(k) + at; }, n, dtype,
        op);
    for (int k = 0; k < ctx.local_size && !pull; ++k) {
      if (k != ctx.me) std::memcpy(buffer(k) + at, buffer(ctx.me) + at, n * element);
    }
  }
  ctx.phase();
  if (!pull) return;
  for (int k = 0; k < ctx.local_size; ++k) {
    if (k == ctx.me) continue;
    const Slice theirs = slice_of(count, ctx.local_size, k, element);
    std::memcpy(buffer(ctx.me) + theirs.lo * element, buffer(k) + theirs.lo * element,
                theirs.size() * element);
  }
  ctx.phase();
}

// all_reduce_partial in place: each rank reduces only the elements it needs
// into its own buffer, reading the others' buffers, which nobody changes
// before the final phase (the ranks' lists do not overlap, so nobody reads
// an element another rank has already overwritten). Each element is reduced
// in the order zero_copy_all_reduce uses (the value of the rank whose slice
// holds it first, then the others by rank), so the bits are the same.
void zero_copy_partial(Context& ctx, std::size_t count, DType dtype, ReduceOp op,
                       const std::vector<ElementRange>& needed) {
  const std::size_t element = dtype_size(dtype);
  const std::size_t block = std::max<std::size_t>(1, kFuseBytes / element);
  char* base = ctx.segment->base();
  auto buffer = [&](int k) { return base + ctx.published(k).offset; };
  for (const ElementRange& range : needed) {
    for (int owner = 0; owner < ctx.local_size; ++owner) {
      const Slice slice = slice_of(count, ctx.local_size, owner, element);
      const std::size_t lo = std::max(range.begin, slice.lo), hi = std::min(range.end, slice.hi);
      for (std::size_t o = lo; o < hi; o += block) {
        const std::size_t n = std::min(block, hi - o), at = o * element;
        // Into this rank's buffer directly when its own value is read by
        // the first step (it is the owner, or the first rank after it; two
        // ranks: always); otherwise through an L1 block, so its value is
        // not overwritten before its turn in the order.
        const int first_other = owner == 0 ? 1 : 0;
        char* out = owner == ctx.me || first_other == ctx.me ? buffer(ctx.me) + at
                                                             : ctx.partial_block.data();
        ctx.reduce_slice_from(
            owner, out, buffer(owner) + at, [&](int k) { return buffer(k) + at; }, n, dtype, op);
        if (out != buffer(ctx.me) + at) std::memcpy(buffer(ctx.me) + at, out, n * element);
      }
    }
  }
  ctx.phase();
}

// All-reduce of two ranks' private buffers, chunk by chunk: each rank
// copies the peer's half of the chunk into its own slot; then, in one pass,
// reduces its own half into its buffer and into the peer's slot (where the
// peer copied that half from); then copies the peer's result for the other
// half out of its own slot. Software-pipelined: the copy-in of chunk i+1 is
// done before waiting for the peer's result of chunk i (its slot parity was
// last used by chunk i-1, finished on both sides), so a rank waits only
// when it is truly ahead.
void two_rank_chunked_all_reduce(Context& ctx, char* data, std::size_t count, DType dtype,
                                 ReduceOp op, ReduceIntoBothFn both) {
  const std::size_t element = dtype_size(dtype);
  const std::size_t per_chunk = ctx.segment->geometry().chunk_bytes / element;
  const std::size_t chunks = (count + per_chunk - 1) / per_chunk;
  const int divisor = op == ReduceOp::kAvg ? ctx.size : 1;
  auto length = [&](std::size_t i) { return std::min(per_chunk, count - i * per_chunk); };
  auto copy_in = [&](std::size_t i, unsigned parity) {
    const Slice theirs = slice_of(length(i), 2, 1 - ctx.me, element);
    std::memcpy(ctx.segment->chunk_slot(ctx.me, parity) + theirs.lo * element,
                data + (i * per_chunk + theirs.lo) * element, theirs.size() * element);
    return ctx.sync->arrive();
  };
  unsigned parity = ctx.chunk_parity++;
  std::uint32_t copied = copy_in(0, parity);
  for (std::size_t i = 0; i < chunks; ++i) {
    char* chunk = data + i * per_chunk * element;
    const Slice mine = slice_of(length(i), 2, ctx.me, element),
                theirs = slice_of(length(i), 2, 1 - ctx.me, element);
    ctx.sync->wait_all(copied,
                       ctx.deadline);  // the peer's copy of this rank's half is in the peer's slot
    both(chunk + mine.lo * element, ctx.segment->chunk_slot(1 - ctx.me, parity) + mine.lo * element,
         mine.size(), divisor);
    const std::uint32_t reduced = ctx.sync->arrive();
    const unsigned next = i + 1 < chunks ? ctx.chunk_parity++ : parity;
    if (i + 1 < chunks) copied = copy_in(i + 1, next);
    ctx.sync->wait_all(
        reduced,
        ctx.deadline);  // the peer's result for the other half is in this rank's slot
    std::memcpy(chunk + theirs.lo * element,
                ctx.segment->chunk_slot(ctx.me, parity) + theirs.lo * element,
                theirs.size() * element);
    parity = next;
  }
}

// Private buffers, pipelined in chunks through double-buffered slots:
// copy in what the others need, reduce this rank's slice into the result
// slot, copy out the others' slices. `to` is the rank that receives the
// result (reduce), or -1 for all (all_reduce). `first`, when given, is
// published with the first chunk's phase.
void chunked_reduce(Context& ctx, char* data, std::size_t count, DType dtype, ReduceOp op, int to,
                    const Descriptor* first) {
  if (to < 0 && first == nullptr && ctx.local_size == 2 && !ctx.cross) {
    if (ReduceIntoBothFn both = reduce_into_both_function(dtype, op); both != nullptr) {
      return two_rank_chunked_all_reduce(ctx, data, count, dtype, op, both);
    }
  }
  const std::size_t element = dtype_size(dtype);
  const std::size_t per_chunk = ctx.segment->geometry().chunk_bytes / element;
  const bool receive = to < 0 || to == ctx.me;
  for (std::size_t b = 0; b < count; b += per_chunk) {
    const std::size_t m = std::min(per_chunk, count - b);
    const unsigned parity = ctx.chunk_parity++;
    char* src = data + b * element;
    char* slot = ctx.segment->chunk_slot(ctx.me, parity);
    char* result = ctx.segment->result_slot(parity);
    const Slice mine = slice_of(m, ctx.local_size, ctx.me, element);
    std::memcpy(slot, src, mine.lo * element);
    std::memcpy(slot + mine.hi * element, src + mine.hi * element, (m - mine.hi) * element);
    if (first != nullptr) {
      ctx.begin(*first);
      first = nullptr;
    } else {
      ctx.phase();
    }
    if (mine.size() > 0) {
      // In blocks that stay in L1 between the reduction and the copy back
      // (within a node; across nodes the slice goes to Gloo whole).
      const std::size_t block =
          ctx.cross ? mine.size() : std::max<std::size_t>(1, kFuseBytes / element);
      for (std::size_t o = mine.lo; o < mine.hi; o += block) {
        const std::size_t n = std::min(block, mine.hi - o), at = o * element;
        ctx.reduce_slice(
            result + at, src + at, [&](int k) { return ctx.segment->chunk_slot(k, parity) + at; },
            n, dtype, op);
        if (receive) std::memcpy(src + at, result + at, n * element);
      }
    }
    ctx.phase();
    if (!receive) continue;
    for (int k = 0; k < ctx.local_size; ++k) {
      if (k == ctx.me) continue;
      const Slice s = slice_of(m, ctx.local_size, k, element);
      std::memcpy(src + s.lo * element, result + s.lo * element, s.size() * element);
    }
  }
}

}  // namespace

void all_reduce(Context& ctx, Algorithm a, void* data, std::size_t count, DType dtype, ReduceOp op,
                const std::vector<ElementRange>* needed, bool timing) {
  const std::size_t bytes = count * dtype_size(dtype);
  Descriptor d = ctx.descriptor(Collective::kAllReduce, dtype, bytes, -1,
                                static_cast<std::int32_t>(op), a, timing);
  if (a == Algorithm::kSmall && bytes <= ctx.segment->geometry().small_bytes && !ctx.cross) {
    return small_all_reduce(ctx, data, count, dtype, op, d);
  }
  d.offset = ctx.segment->offset_of(data, bytes);
  ctx.begin(d);
  const bool in_place = (a == Algorithm::kPush || a == Algorithm::kPull) && ctx.all_in_segment();
  if (in_place && needed != nullptr && !ctx.cross)
    return zero_copy_partial(ctx, count, dtype, op, *needed);
  if (in_place)
    return zero_copy_all_reduce(ctx, count, dtype, op, a == Algorithm::kPull && !ctx.cross);
  chunked_reduce(ctx, static_cast<char*>(data), count, dtype, op, -1, nullptr);
}

void reduce(Context& ctx, void* data, std::size_t count, DType dtype, ReduceOp op, int root) {
  const Descriptor d = ctx.descriptor(Collective::kReduce, dtype, count * dtype_size(dtype), root,
                                      static_cast<std::int32_t>(op), Algorithm::kChunked, false);
  chunked_reduce(ctx, static_cast<char*>(data), count, dtype, op, root, &d);
}

}  // namespace ddp::shm
