#pragma once
// --hang_timeout in a running attempt: samples the worker group (the
// progress board, /proc) for the hang detector and, once it finds a hang,
// collects where the ranks are stuck: native stacks at once (the ranks are
// still stuck), Python tracebacks by SIGABRT to ranks whose fault handler
// writes every thread's traceback to stderr; then builds the report. Driven
// by the agent's event loop; not thread-safe.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "ddp/common/progress_board.h"
#include "observe/hang_detector.h"
#include "worker_group/failure_report.h"
#include "worker_group/worker_group.h"

namespace ddp::launcher {

class HangWatch {
 public:
  using Clock = std::chrono::steady_clock;
  // Lines of stderr each rank keeps, enough for a Python rank's traceback dump.
  static constexpr size_t kKeptStderrLines = 300;

  // `board`: the one the workers count on (outlives this). `python`: the
  // workers run Python. `spare_waiters` (--on_failure=heal): only the blamed
  // ranks are sent SIGABRT for their tracebacks, so that the ranks waiting
  // for them live on to heal them (their stacks are then not shown).
  HangWatch(double timeout_s, const ProgressBoard& board, bool python, bool spare_waiters = false);

  // When tick() next has something to do.
  Clock::time_point next_wake() const;
  // Samples when due; after a hang was found, waits for the tracebacks.
  // Returns true once, when the report is ready: then blamed() and report().
  bool tick(WorkerGroup& group);
  // A hang was found (its tracebacks may still be on their way): the
  // workers' exits are the dump, not failures.
  bool found() const { return dump_.has_value(); }
  // Every local rank began the collective the stuck ones wait in: the rank
  // to blame is on another node (whose agent, if it sees that rank stuck
  // too, sends the report that names it).
  bool waits_elsewhere() const { return dump_ && dump_->verdict.waits_elsewhere; }

  // The blamed ranks' outcomes (marked hung), the first one first.
  std::vector<WorkerOutcome> blamed(const WorkerGroup& group) const;
  std::string report(const WorkerGroup& group, int attempt, int max_restarts) const;

 private:
  void begin_dump(WorkerGroup& group, HangVerdict verdict);
  void finish_dump(WorkerGroup& group);
  std::vector<RankSample> sample(const WorkerGroup& group) const;

  struct Dump {
    HangVerdict verdict;
    std::vector<StuckRank> stacks;  // native ranks', then the Python tracebacks
    std::vector<size_t> aborted;    // Python ranks sent SIGABRT
    Clock::time_point deadline;     // for their tracebacks
    bool done = false;
  };
  double timeout_s_;
  const ProgressBoard& board_;
  bool python_;
  bool spare_waiters_;
  HangDetector detector_;
  std::chrono::milliseconds sample_every_;
  Clock::time_point next_sample_;
  std::optional<Dump> dump_;
};

}  // namespace ddp::launcher
