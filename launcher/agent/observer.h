#pragma once
// Observer: the agent's observability in one place (docs/observability.md).
// The agent tells it what happens (rounds, worker starts and exits,
// failures, restarts, relaunches, hangs); it writes the event log
// (--events_file), counts for the metrics (--metrics_port), and, every
// --status_interval, samples the workers (StatusProbe) for the metrics and
// for ddprun status (handed to the control plane, which carries it to the
// rendezvous server). Driven by the agent's loop; not thread-safe.

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "agent/control_plane.h"
#include "cli/launch_spec.h"
#include "observe/event_log.h"
#include "observe/job_status.h"
#include "observe/metric_set.h"
#include "observe/metrics_server.h"
#include "observe/status_probe.h"
#include "observe/straggler_detector.h"
#include "worker_group/worker_group.h"

namespace ddp::launcher {

class Observer {
 public:
  using Clock = std::chrono::steady_clock;
  // Opens the event log and starts the metrics server (throws ddp::Error:
  // a port in use, a file that cannot be opened), before any worker starts.
  Observer(const LaunchSpec& spec, const std::string& hostname);

  void round_started(const RoundAssignment& round);
  // state: SUCCEEDED, FAILED, STOPPED.
  void round_ended(const std::string& state, const std::string& message);
  void workers_started(const WorkerGroup& group);
  void worker_exited(const Worker& w);
  void failure(const WorkerOutcome& outcome, const std::string& report);
  // reason: worker_failure, hang, other_node.
  void restart(const std::string& reason, const std::string& message);
  void relaunched(const Worker& w);
  void hang(const WorkerOutcome& blamed, const std::string& report);

  // When the next sample is due (time_point::max() when sampling is off).
  Clock::time_point next_sample() const { return next_; }
  // Samples now if due: the metrics and the control plane get it.
  void tick(const WorkerGroup& group, const ProgressBoard* board, ControlPlane& control,
            RoundWatch* watch);

 private:
  EventRecord record(const std::string& name) const;
  // The same, naming the rank, its local rank and its pid.
  EventRecord record_of(const std::string& name, const WorkerOutcome& rank) const;
  void post(const EventRecord& e);
  // Events for the verdicts on nodes the rendezvous hosted here reached.
  void post_node_stragglers(ControlPlane& control);
  // Judges the sample's ranks (StragglerDetector) and marks them in `node`;
  // says each rank named or cleared in the log and the event log.
  void judge_stragglers(Clock::time_point now, NodeStatus& node);

  const LaunchSpec& spec_;
  std::string hostname_;
  Clock::time_point started_ = Clock::now();
  Clock::time_point next_;
  std::optional<RoundAssignment> round_;
  int restarts_ = 0;
  NodeCounters counters_;
  StatusProbe probe_;
  StragglerDetector stragglers_;
  std::unique_ptr<EventLog> events_;
  std::unique_ptr<MetricsServer> metrics_;
};

}  // namespace ddp::launcher
