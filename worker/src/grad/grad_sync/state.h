#pragma once
// What GradAverager's own calls need of either implementation (internal):
// the group, the parameters, the options, and the iteration bookkeeping and
// statistics under one mutex. GradSync::Impl and SharedGradSum's Impl derive
// from it, so GradAverager holds the implementation pointer.

#include <algorithm>
#include <memory>
#include <mutex>
#include <vector>

#include "core/progress_counter.h"
#include "ddp/grad_averager.h"
#include "grad/grad_sync/iteration.h"
#include "grad/grad_sync/param_list.h"
#include "grad/grad_sync/stats.h"

namespace ddp::detail {

// *group; throws "<who>: the process group is null" for a null one.
ProcessGroup& non_null(const std::shared_ptr<ProcessGroup>& group, const char* who);

struct AveragerState {
  // `who` names the class in errors and logs ("GradSync", "SharedGradSum").
  AveragerState(const char* who, std::shared_ptr<ProcessGroup> owned, ProcessGroup& group,
                std::vector<GradParam> params, GradSyncOptions options)
      : owned_group(std::move(owned)),
        group(group),
        params(who, std::move(params)),
        options(options),
        iteration(this->params.size()) {}
  virtual ~AveragerState() = default;

  // Throws, naming `what`, during an iteration. Takes mu.
  void require_between(const char* what) const {
    std::lock_guard<std::mutex> lock(mu);
    iteration.require_between(params, what, stats.iterations() + 1);
  }
  // A new iteration's figures: `synced`, and the compute time, its backward
  // window (whose end goes to *end) less `not_compute_ms`. REQUIRES: mu held.
  IterationStats figures_locked(bool synced, Clock::time_point enter, double not_compute_ms,
                                Clock::time_point* end) const {
    IterationStats s;
    s.synced = synced;
    const auto start = iteration.window_start(enter);
    *end = iteration.window_end(start);
    s.backward_compute_ms = std::max(0.0, ms(*end - start) - not_compute_ms);
    return s;
  }
  // Records `s` as this iteration's and ends the iteration. REQUIRES: mu held.
  void record_locked(const IterationStats& s) {
    stats.record(s);
    iteration.end(s.synced);
    if (s.synced) step_finished();  // ddprun status: the rank's steps and their time
  }
  // Whether rank 0 logs a synced `s` now (the caller's line); logs a no_sync
  // one itself and returns false.
  bool log_synced(const IterationStats& s) const;

  std::shared_ptr<ProcessGroup> owned_group;
  ProcessGroup& group;
  ParamList params;
  GradSyncOptions options;

  mutable std::mutex mu;  // guards what follows, and the derived classes' iteration state
  Iteration iteration;
  StatsBook stats;
};

}  // namespace ddp::detail
