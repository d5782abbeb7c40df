#pragma once
// The state every shm collective shares (internal to libddp): this rank's
// place on its node, the node's segment, the phase sync, the deadline of the
// call in progress and the parities of the double-buffered slots. The
// collectives are free functions over it (variants.h); the backend
// (shm_backend.h) owns it.
//
// Every collective is a sequence of phases (core/phase_sync.h). Buffers in the
// segment are double-buffered by parity, and every collective step follows
// one rule: a rank writes its slot before a phase and peers read it after
// that phase, finishing before they arrive at any later phase; a slot's next
// write of the same parity comes two steps later, after a phase every reader
// arrived at only once done. So no step needs a phase of its own to release
// its buffers. A collective's first phase also publishes what each rank is
// doing (a Descriptor) so a mismatch is an error, not corrupt data.
//
// Not thread-safe: one thread runs the group's collectives at a time.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "backends/shm/algorithms.h"
#include "backends/shm/segment.h"
#include "core/backend.h"
#include "core/phase_sync.h"
#include "kernels/reduce_kernels.h"

namespace ddp::shm {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kFuseBytes = 16 << 10;  // reduce-then-copy block of the private path

// "all_reduce of 4096 bytes of float32 (sum)", for mismatch errors.
std::string describe(const Descriptor& d);

// Elements [lo, hi) of part `k` when `count` are split into `parts`, every
// boundary on a cache line (no two ranks write one line).
struct Slice {
  std::size_t lo, hi;
  std::size_t size() const { return hi - lo; }
};
inline Slice slice_of(std::size_t count, int parts, int k, std::size_t element) {
  const std::size_t align = std::max<std::size_t>(1, kCacheLine / element);
  const std::size_t per = ((count + parts - 1) / parts + align - 1) / align * align;
  const std::size_t lo = std::min(count, per * static_cast<std::size_t>(k));
  return {lo, std::min(count, lo + per)};
}

// Where a variant that reads or writes other ranks' buffers can run: `pull`
// needs the buffers it reads in the segment, `push` those it writes; a
// variant that cannot run falls to the other in-place one, then to chunked.
Algorithm runnable(Algorithm wanted, bool can_pull, bool can_push);

struct Context {
  // Set when the group is made.
  int me = 0;                       // local rank
  int local_size = 1;               // ranks on this node
  int first_rank = 0;               // the group rank of local rank 0
  int size = 1;                     // the group's ranks (kAvg divides by it)
  Segment* segment = nullptr;       // the node's; owned by the backend
  std::unique_ptr<PhaseSync> sync;  // over the node's ranks
  Backend* cross = nullptr;         // across nodes: Gloo among this local rank's peers
  std::uint32_t forced = 0;         // Forced::packed(), published for every rank to compare
  std::uint32_t budget_us = 0;      // the timing budget, published likewise
  // Per call.
  Clock::time_point deadline;  // of the collective in progress
  std::uint64_t sequence = 0;  // collectives that published a descriptor
  unsigned parity = 0;         // of the current collective's descriptor
  unsigned small_parity = 0, chunk_parity = 0;
  alignas(64) std::array<char, kFuseBytes> partial_block{};  // zero_copy_partial's block

  // What local rank `k` published for the current collective.
  const Descriptor& published(int k) const { return segment->control(k).descriptor[parity & 1]; }
  // Whether every rank published its buffer (`where`: output or input) as in the segment.
  bool all_in_segment(std::int64_t Descriptor::*where = &Descriptor::offset) const;

  // What this rank says about a collective: what, of what, how, and its settings.
  Descriptor descriptor(Collective c, DType dtype, std::size_t bytes, std::int32_t root,
                        std::int32_t op, Algorithm a, bool timing) const;

  // The first phase of a collective: publish what this rank is doing, wait
  // for every rank, and check they all do the same the same way. Throws
  // CollectiveMismatchError naming both ranks' calls when they differ.
  void begin(const Descriptor& mine);

  // One phase: every local rank arrives before any goes on (bounded by deadline).
  void phase() { sync->phase(deadline); }

  // out = first's value (`mine` when first is this rank) op every other
  // rank's `others(k)` in rank order, n elements. Each slice is reduced by
  // one rank only, always from its owner's value, so every rank ends with the
  // same bits. `out` may be `mine` or an `others(k)` only where that value is
  // read by the first step (elementwise, before it is written).
  template <class Others>
  void reduce_slice_from(int first, char* out, const char* mine, Others&& others, std::size_t n,
                         DType dtype, ReduceOp op) {
    ReduceFn fn = reduce_function(dtype, op);
    const char* acc = mine;
    for (int k = 0; k < local_size; ++k) {
      if (k == first) continue;
      fn(out, acc, others(k), n);
      acc = out;
    }
    // Across nodes: the same slice of every node, then the average over all ranks.
    if (cross) cross->all_reduce(out, n, dtype, op == ReduceOp::kAvg ? ReduceOp::kSum : op);
    if (op == ReduceOp::kAvg) divide_in_place(out, n, dtype, size);
  }
  template <class Others>
  void reduce_slice(char* out, const char* mine, Others&& others, std::size_t n, DType dtype,
                    ReduceOp op) {
    reduce_slice_from(me, out, mine, others, n, dtype, op);
  }
};

}  // namespace ddp::shm
