#pragma once
// Decides when a worker group has hung (--hang_timeout) and says which rank
// is stuck and who waits for it. Pure logic: the agent samples the ranks
// (the progress board, /proc) and passes the time in; unit-tested with
// made-up samples.
//
// Progress, per rank:
//   - a libddp rank (one that writes the progress board): it began or
//     completed a collective, or it is outside any collective and used CPU
//     time (computing between collectives is progress; spinning inside one
//     is not);
//   - any other program: its process group used CPU time (a stopped or
//     deadlocked process uses none).
// The group has hung when some rank has made no progress for the timeout.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/common/progress_board.h"

namespace ddp::launcher {

struct RankSample {
  int rank = 0;  // global rank
  bool libddp = false;
  std::uint64_t begun = 0, completed = 0;  // from the board (libddp ranks)
  ProgressOp op = ProgressOp::kNone;       // the last collective begun
  std::uint64_t cpu_ticks = 0;             // CPU time of the rank's process group, any unit
  bool stopped = false;                    // in the stopped state (SIGSTOP, Ctrl-Z, a debugger)
  bool exited = false;  // ended already (successfully): never stuck, but may be waited for
};

struct HangVerdict {
  // Indexes (into the samples) of the ranks to blame: those the waiting
  // ranks wait for, and stuck ranks outside any collective; when every
  // stuck rank waits in a collective all local ranks began, those ranks.
  std::vector<int> blamed;
  std::vector<int> stuck;  // every rank without progress for the timeout
  // What each blamed rank is doing and who waits for it, e.g.
  // "rank 1: stopped (SIGSTOP or a debugger), between collectives (56 done);
  //  ranks 0, 2 wait for it in all_reduce #57".
  std::vector<std::string> lines;
  bool waits_elsewhere = false;  // every local rank began the collective the stuck ones wait in
};

class HangDetector {
 public:
  using Clock = std::chrono::steady_clock;
  explicit HangDetector(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  // Takes one sample of every rank (the same order each time). Returns the
  // verdict once some rank has made no progress for the timeout.
  std::optional<HangVerdict> observe(Clock::time_point now, const std::vector<RankSample>& ranks);

 private:
  std::chrono::milliseconds timeout_;
  std::vector<RankSample> last_;
  std::vector<Clock::time_point> last_progress_;
};

// "0", "0, 2", "0-3": ranks in ascending order, runs of three or more joined.
std::string rank_list(std::vector<int> ranks);

}  // namespace ddp::launcher
