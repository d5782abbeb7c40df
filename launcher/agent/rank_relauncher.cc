#include "agent/rank_relauncher.h"

#include <signal.h>

#include "agent/heal_policy.h"
#include "ddp/common/error.h"
#include "ddp/common/launcher_log.h"
#include "ddp/common/shm_names.h"
#include "worker_group/process.h"

namespace ddp::launcher {

RankRelauncher::RankRelauncher(ControlPlane& control, const HealMarks& marks,
                               const LaunchInputs& in)
    : control_(control),
      marks_(marks),
      in_(in),
      incarnations_(static_cast<std::size_t>(in.spec.nproc_per_node), first_incarnation(in.round)) {
  for (int i = 0; i < in.spec.nproc_per_node; ++i) marks_.clear(i);
}

bool RankRelauncher::relaunch(WorkerGroup& group, std::size_t i) {
  WorkerOutcome failed = group[i].outcome;
  failed.hung = hung_.count(i) > 0;
  control_.note_exited(in_.round, failed.rank, failed.pid);
  const int local = static_cast<int>(i);
  const bool opted_in = marks_.exists(local);
  if (heal_step(opted_in, control_.restarts_left()) != HealStep::kRelaunch) {
    if (!opted_in) launcher_log().warn("{}", not_opted_in_line(failed, control_.restarts_left()));
    return false;
  }
  const int spent = control_.spend_restart();
  if (spent == 0) return false;
  launcher_log().warn("{}", relaunch_line(failed, spent, in_.spec.max_restarts));
  marks_.clear(local);
  // Its carried shm arena and state memory (libddp's live recovery keeps
  // them in /dev/shm) go to the relaunch, whose gradient buckets, weights
  // and optimizer state then find their pages made.
  pass_carried_memory_to_heir(in_.spec.run_id, failed.pid, failed.rank);
  try {
    group.relaunch(i, worker_relaunch(in_, local, ++incarnations_[i]));
  } catch (const Error& e) {
    launcher_log().error("error: could not relaunch rank {}: {}", failed.rank, e.what());
    return false;
  }
  hung_.erase(i);
  ++relaunches_;
  return true;
}

bool RankRelauncher::take_hang(WorkerGroup& group, const std::vector<WorkerOutcome>& blamed,
                               const std::string& report) {
  std::size_t opted_in = 0;
  for (const auto& b : blamed) {
    if (marks_.exists(b.local_rank)) {
      ++opted_in;
    } else {
      launcher_log().warn("{}", not_opted_in_line(b, control_.restarts_left()));
    }
  }
  if (!heal_takes_hang(blamed.size(), opted_in, group.size(), control_.restarts_left())) {
    return false;
  }
  launcher_log().warn("{}", report);
  hang_report_ = report;
  for (const auto& b : blamed) {
    const auto i = static_cast<std::size_t>(b.local_rank);
    hung_[i] = b;
    if (group[i].running) signal_group(group[i].pid, SIGKILL);
  }
  return true;
}

std::optional<std::pair<WorkerOutcome, std::string>> RankRelauncher::hang_of(std::size_t i) const {
  auto it = hung_.find(i);
  if (it == hung_.end()) return std::nullopt;
  return std::pair{it->second, hang_report_};
}

}  // namespace ddp::launcher
