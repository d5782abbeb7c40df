#pragma once
// --on_failure=heal in a running attempt: relaunches a failed rank alone
// (heal_policy.h decides when), with DDP_INCARNATION counting its relaunches
// in the round, and takes over hangs by killing the blamed ranks so that
// their exits are relaunched too. Driven by the agent's event loop; not
// thread-safe. Lives as long as the attempt's worker group.

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "agent/control_plane.h"
#include "agent/heal_marks.h"
#include "agent/worker_launches.h"
#include "worker_group/failure_report.h"
#include "worker_group/worker_group.h"

namespace ddp::launcher {

class RankRelauncher {
 public:
  // Removes every local rank's mark (a stale one from an earlier attempt):
  // call before the attempt's workers start. `in` outlives this.
  RankRelauncher(ControlPlane& control, const HealMarks& marks, const LaunchInputs& in);

  // Worker `i` of `group` ended badly while the group was not stopping.
  // When it opted in and a restart is left: spends it, says so in one line
  // and relaunches the rank (true). Otherwise says why when it had not opted
  // in, and returns false: the caller handles it as --on_failure=restart.
  bool relaunch(WorkerGroup& group, std::size_t i);

  // --hang_timeout blamed these ranks (`report`: the hang report). When heal
  // takes the hang over (heal_takes_hang), logs the report, SIGKILLs the
  // blamed ranks still running (each one's exit is then relaunched) and
  // returns true; the caller then treats the blamed ranks that have already
  // ended (a Python rank's traceback dump) as failed.
  bool take_hang(WorkerGroup& group, const std::vector<WorkerOutcome>& blamed,
                 const std::string& report);

  // A rank killed for a hang that could not be relaunched after all: its
  // outcome (hung) and the hang report, for the attempt's failure.
  std::optional<std::pair<WorkerOutcome, std::string>> hang_of(std::size_t i) const;

  int relaunches() const { return relaunches_; }

 private:
  ControlPlane& control_;
  const HealMarks& marks_;
  const LaunchInputs& in_;
  std::vector<int> incarnations_;              // per local rank: relaunches this round
  std::map<std::size_t, WorkerOutcome> hung_;  // killed for the hang (their outcome, hung)
  std::string hang_report_;
  int relaunches_ = 0;
};

}  // namespace ddp::launcher
