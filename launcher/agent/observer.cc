#include "agent/observer.h"

#include <unistd.h>

#include "ddp/common/launcher_log.h"

namespace ddp::launcher {

Observer::Observer(const LaunchSpec& spec, const std::string& hostname)
    : spec_(spec),
      hostname_(hostname),
      next_(spec.status_interval_s > 0 ? Clock::now() : Clock::time_point::max()),
      stragglers_(straggler_rule(spec.straggler_window_s, spec.status_interval_s)) {
  if (!spec.events_file.empty()) events_ = std::make_unique<EventLog>(spec.events_file);
  if (spec.metrics_port > 0) {
    metrics_ = std::make_unique<MetricsServer>(
        spec.metrics_port,
        std::map<std::string, std::string>{{"run_id", spec.run_id}, {"host", hostname}});
  }
}

EventRecord Observer::record(const std::string& name) const {
  EventRecord e;
  e.name = name;
  e.timestamp_ms = wall_clock_ms();
  e.run_id = spec_.run_id;
  e.hostname = hostname_;
  e.role = spec_.role;
  if (round_) {
    e.round = round_->round;
    e.group_rank = round_->group_rank;
    e.restart_count = round_->restart_count;
  }
  return e;
}

void Observer::post(const EventRecord& e) {
  if (events_) events_->post(e);
}

void Observer::round_started(const RoundAssignment& round) {
  round_ = round;
  restarts_ = round.restart_count;
  ++counters_.rounds;
  EventRecord e = record("round_start");
  e.message = round.reason;
  post(e);
}

void Observer::round_ended(const std::string& state, const std::string& message) {
  EventRecord e = record("round_end");
  e.state = state;
  e.message = message;
  post(e);
}

void Observer::workers_started(const WorkerGroup& group) {
  for (size_t i = 0; i < group.size(); ++i) {
    ++counters_.worker_starts;
    EventRecord e = record("worker_start");
    e.global_rank = group[i].rank;
    e.local_rank = group[i].local_rank;
    e.pid = group[i].pid;
    post(e);
  }
}

void Observer::worker_exited(const Worker& w) {
  const char* outcome = w.outcome.signaled   ? "signaled"
                        : w.outcome.failed() ? "failed"
                                             : "succeeded";
  ++counters_.worker_exits[outcome];
  EventRecord e = record("worker_exit");
  e.source = "WORKER";
  e.global_rank = w.rank;
  e.local_rank = w.local_rank;
  e.pid = w.pid;
  e.state = w.outcome.failed() ? "FAILED" : "SUCCEEDED";
  if (w.outcome.signaled) {
    e.signal = w.outcome.code;
  } else {
    e.exit_code = w.outcome.code;
  }
  post(e);
}

EventRecord Observer::record_of(const std::string& name, const WorkerOutcome& rank) const {
  EventRecord e = record(name);
  e.global_rank = rank.rank;
  e.local_rank = rank.local_rank;
  e.pid = rank.pid;
  return e;
}

void Observer::failure(const WorkerOutcome& outcome, const std::string& report) {
  ++counters_.failures;
  EventRecord e = record_of("failure", outcome);
  e.exit_code = outcome.launcher_exit_code();
  e.message = report;
  post(e);
}

void Observer::restart(const std::string& reason, const std::string& message) {
  ++counters_.restarts[reason];
  EventRecord e = record("restart");
  e.state = reason;
  e.message = message;
  post(e);
}

void Observer::relaunched(const Worker& w) {
  ++counters_.relaunches;
  ++counters_.worker_starts;
  EventRecord e = record("relaunch");
  e.global_rank = w.rank;
  e.local_rank = w.local_rank;
  e.pid = w.pid;
  post(e);
}

void Observer::hang(const WorkerOutcome& blamed, const std::string& report) {
  ++counters_.hangs;
  EventRecord e = record_of("hang", blamed);
  e.message = report.substr(0, report.find('\n'));
  post(e);
}

void Observer::judge_stragglers(Clock::time_point now, NodeStatus& node) {
  if (spec_.straggler_window_s <= 0) return;  // --straggler_window=0: off
  std::vector<StragglerSample> samples;
  const auto& arrivals = probe_.arrivals();
  for (std::size_t i = 0; i < node.ranks.size(); ++i) {
    StragglerSample s;
    s.rank = node.ranks[i].rank;
    s.pid = node.ranks[i].pid;
    if (i < arrivals.size()) s.arrivals = arrivals[i];
    samples.push_back(s);
  }
  for (const auto& change : stragglers_.observe(now, samples)) {
    const RankStatus* r = nullptr;
    for (const auto& x : node.ranks) {
      if (x.rank == change.rank) r = &x;
    }
    if (change.named) {
      ++counters_.stragglers_named;
      launcher_log().warn("straggler: {}", change.evidence);
    } else {
      launcher_log().info("straggler recovered: {}", change.evidence);
    }
    EventRecord e = record("straggler");
    e.global_rank = change.rank;
    if (r) {
      e.local_rank = r->local_rank;
      e.pid = r->pid;
    }
    e.state = change.named ? "NAMED" : "RECOVERED";
    e.message = change.evidence;
    post(e);
  }
  for (auto& r : node.ranks) {
    r.straggler_score = stragglers_.score(r.rank);
    r.straggler = stragglers_.named(r.rank);
  }
}

void Observer::post_node_stragglers(ControlPlane& control) {
  // The rendezvous logged them; the event log of the node that hosts it
  // records them (the straggler's node in `message`).
  for (const auto& change : control.take_node_straggler_changes()) {
    EventRecord e = record("straggler");
    e.state = change.named ? "NAMED" : "RECOVERED";
    e.message = change.evidence;
    post(e);
  }
}

void Observer::tick(const WorkerGroup& group, const ProgressBoard* board, ControlPlane& control,
                    RoundWatch* watch) {
  const auto now = Clock::now();
  if (now < next_) return;
  next_ = now + std::chrono::duration_cast<Clock::duration>(
                    std::chrono::duration<double>(spec_.status_interval_s));
  NodeStatus node;
  node.run_id = spec_.run_id;
  node.host = hostname_;
  node.age_s = std::chrono::duration<double>(now - started_).count();
  if (round_) {
    node.node_rank = round_->group_rank;
    node.round = round_->round;
    node.world_size = round_->world_size;
    node.restarts = round_->restart_count;
  }
  node.relaunches = static_cast<int>(counters_.relaunches);
  node = probe_.sample(node, group, board);
  judge_stragglers(now, node);
  control.publish(node);
  post_node_stragglers(control);
  if (!metrics_) return;
  if (events_) counters_.events_dropped = static_cast<std::int64_t>(events_->dropped());
  NodeExtras extras;
  extras.nodes = round_ ? round_->group_world_size : 1;
  extras.max_restarts = spec_.max_restarts;
  extras.heartbeat_age_s = watch ? std::max(0.0, watch->heartbeat_age_s()) : 0;
  extras.node_stragglers = control.node_straggler_scores();
  metrics_->update(metric_samples(node, counters_, extras));
}

}  // namespace ddp::launcher
