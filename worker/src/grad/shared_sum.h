#pragma once
// The shared sum behind GradSync's CommMode::kShared (internal to libddp).
//
// On one node the ranks need not move gradients at all: each rank adds its
// gradient straight into ONE buffer that every rank maps, block by block,
// every block held by one rank at a time. Whoever reaches a block first in an
// accumulation window sets it (a GEMM's beta = 0); the others add to it
// (beta = 1). The reduction happens inside the writes, with no pass of its
// own and no thread beside the backward pass. Two result buffers alternate
// between windows, so a rank may start the next window while another rank
// still reads this window's result.
//
// Protocol. A block's state is one 64-bit word on its own cache line:
//   contributions << 16 | holder     (holder: 0 free, else rank + 1)
// Every rank contributes every block exactly once per round (a round is an
// iteration: finish() to finish()), so after round r (0-based) is complete on
// every rank each block counts (r + 1) * world contributions. A window that
// begins at round w0 starts from w0 * world: whoever finds that count is first.
// A rank takes the blocks of a parameter starting at its own offset
// (rank * blocks / world), skipping held ones, so ranks that reach a
// parameter together work on different blocks.
//
// Why double buffering is enough: a rank writes window k + 1's buffer (the
// one window k - 1 used) only after its finish() of window k, which waited
// for every rank's contributions to window k, and every rank contributes to
// window k only after it stopped reading window k - 1's result.
//
// Thread-safety: contribute() may run on several threads of a rank at once
// for different parameters; everything else on one thread.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/phase_sync.h"
#include "ddp/common/error.h"

namespace ddp::detail {

// A wait of the shared sum passed the timeout, or the rank waited for exited
// (the message names it): the sums of this window are lost on every rank.
class SharedSumTimeout : public Error {
 public:
  using Error::Error;
};

// What the layout needs of a parameter.
struct SumParam {
  std::size_t count = 0;          // elements
  std::size_t element_bytes = 4;  // bytes per element
  std::int64_t rows = 1;          // shape[0] (1 for a scalar): blocks are whole rows
  bool trainable = true;          // false: no gradient, no room, no blocks
};

// Rows [row_begin, row_begin + rows) of one parameter.
struct SumBlock {
  std::size_t param = 0;
  std::int64_t row_begin = 0;
  std::int64_t rows = 0;
  std::size_t offset = 0;  // bytes from the start of a result buffer
};

struct SumLayout {
  std::vector<std::size_t> param_offset;            // bytes into a result buffer (64-aligned)
  std::vector<std::size_t> row_bytes;               // per parameter: bytes of one row
  std::vector<std::vector<std::size_t>> blocks_of;  // per parameter: its blocks, in row order
  std::vector<SumBlock> blocks;
  std::size_t buffer_bytes = 0;  // one result buffer, a multiple of 64
};

// Parameters in registration order, each starting on a 64-byte boundary. A
// parameter is cut into about bytes / min_block_bytes row blocks, at most
// 2 * world (enough for the ranks to pass each other) and at most its rows;
// at least one. Pure. Throws ddp::Error for world < 1, min_block_bytes == 0
// or a count that is not a whole number of rows.
SumLayout make_sum_layout(const std::vector<SumParam>& params, int world,
                          std::size_t min_block_bytes);

// One block handed to the writer: `data` is the block's first element inside
// the shared buffer; `first` means set it, otherwise add to it.
struct BlockWrite {
  void* data = nullptr;
  std::int64_t row_begin = 0;
  std::int64_t rows = 0;
  bool first = false;
};

class SharedSum {
 public:
  // Bytes of node-shared memory the protocol needs for `layout` and `world`.
  static std::size_t bytes_needed(const SumLayout& layout, int world);

  // `memory`: bytes_needed() zeroed bytes that every rank maps (private
  // memory for a world of one), 64-byte aligned, outliving this object.
  // `name(p)` names parameter p in errors. Waiting follows `policy` (the shm
  // backend's: spin for policy.spin, or yield at once when oversubscribed),
  // then yields, then sleeps in short slices.
  SharedSum(SumLayout layout, void* memory, int rank, int world, std::chrono::milliseconds timeout,
            shm::WaitPolicy policy, std::function<std::string(std::size_t)> name);

  const SumLayout& layout() const { return layout_; }

  // Adds this rank's contribution to parameter `param` in the window whose
  // index is `window` and whose first round is `window_round`: write() runs
  // once per block while this rank holds it. Returns the milliseconds spent
  // waiting for blocks other ranks held. Throws SharedSumTimeout naming the
  // holder when its process exits or the block stays held past the timeout (the rest of the
  // parameter is then never added by this rank: the sum is lost for every rank). When write()
  // throws, the rest of the parameter's blocks count as zeros (set to zero where this rank is
  // first), the parameter is flagged missing for the window, and the exception propagates once
  // every block is counted.
  double contribute(std::size_t param, std::uint64_t window, std::uint64_t window_round,
                    const std::function<void(const BlockWrite&)>& write);

  // This rank has contributed everything of its first `rounds` rounds.
  void publish_rounds(std::uint64_t rounds);
  // Waits until every rank's contributions of the first `rounds` rounds are
  // in every block; returns the milliseconds waited. Throws SharedSumTimeout
  // naming a rank that exited, or the ranks that have not published `rounds`
  // within the timeout.
  double wait_rounds(std::uint64_t rounds);

  // Parameter `param`'s sum in the buffer of window `window` (windows
  // alternate between two buffers).
  void* result(std::size_t param, std::uint64_t window) const;

  // Parameter `param` had no (valid) gradient in window `window` on some rank.
  // The flag is seen by every rank after wait_rounds() of that window.
  void flag_missing(std::size_t param, std::uint64_t window);
  bool missing(std::size_t param, std::uint64_t window) const;

 private:
  std::atomic<std::uint64_t>& state(std::size_t block) const;
  // Milliseconds waited until a block of `param` not yet `done` was free.
  double wait_for_a_free_block(std::size_t param, const std::vector<std::size_t>& ids,
                               const std::vector<char>& done);
  std::atomic<std::uint64_t>& rounds_of(int rank) const;
  std::atomic<std::int64_t>& pid_of(int rank) const;
  // Whether `rank`'s process has exited (checked only once a wait that began
  // at `since` is long, at most every 10 ms, `checked` keeping the last time).
  bool exited(int rank, std::chrono::steady_clock::time_point since,
              std::chrono::steady_clock::time_point& checked) const;
  std::atomic<std::uint64_t>& missing_word(std::size_t param, std::uint64_t window) const;
  void pause(std::chrono::steady_clock::time_point since) const;

  SumLayout layout_;
  char* memory_;
  int rank_, world_;
  std::chrono::milliseconds timeout_;
  shm::WaitPolicy policy_;
  std::function<std::string(std::size_t)> name_;
  std::size_t states_at_ = 0, rounds_at_ = 0, missing_at_ = 0;  // byte offsets into memory_
};

}  // namespace ddp::detail
