#include "observe/metric_set.h"

namespace ddp::launcher {

namespace {

using T = MetricType;

// The set: a table, documented row by row in docs/observability.md.
const std::vector<MetricDef> kMetricDefs = {
    {"ddprun_info", T::kGauge, {}, "", "Always 1; its labels name the job (run_id) and the host"},
    {"ddprun_uptime_seconds", T::kGauge, {}, "seconds", "Since this ddprun started"},
    {"ddprun_round", T::kGauge, {}, "", "The round this node runs (1 for the first)"},
    {"ddprun_rounds_total", T::kCounter, {}, "", "Rounds this node has joined"},
    {"ddprun_world_size", T::kGauge, {}, "ranks", "WORLD_SIZE of the current round"},
    {"ddprun_nodes", T::kGauge, {}, "nodes", "Nodes in the current round"},
    {"ddprun_local_world_size", T::kGauge, {}, "ranks", "Worker processes of this node"},
    {"ddprun_max_restarts", T::kGauge, {}, "", "The job's restart budget (--max_restarts)"},
    {"ddprun_restarts_total",
     T::kCounter,
     {"reason"},
     "",
     "Worker-group restarts, by reason (worker_failure, hang, other_node)"},
    {"ddprun_heal_relaunches_total", T::kCounter, {}, "", "Ranks relaunched alone (heal)"},
    {"ddprun_hangs_total", T::kCounter, {}, "", "Hangs found by --hang_timeout"},
    {"ddprun_failures_total", T::kCounter, {}, "", "Worker failures reported by this node"},
    {"ddprun_worker_starts_total", T::kCounter, {}, "", "Worker processes started"},
    {"ddprun_worker_exits_total",
     T::kCounter,
     {"outcome"},
     "",
     "Worker exits, by outcome (succeeded, failed, signaled)"},
    {"ddprun_workers", T::kGauge, {"state"}, "ranks", "This node's ranks in each state"},
    {"ddprun_heartbeat_age_seconds",
     T::kGauge,
     {},
     "seconds",
     "Since the rendezvous last answered this node's heartbeat (0 on one node)"},
    {"ddprun_events_dropped_total", T::kCounter, {}, "", "Event-log records dropped"},
    {"ddprun_rank_up", T::kGauge, {"rank", "local_rank"}, "", "1 while the rank's process runs"},
    {"ddprun_rank_cpu_usage_ratio",
     T::kGauge,
     {"rank", "local_rank"},
     "cores",
     "CPU time per second of the rank's process group"},
    {"ddprun_rank_resident_memory_bytes",
     T::kGauge,
     {"rank", "local_rank"},
     "bytes",
     "Resident set of the rank's process"},
    {"ddprun_rank_last_output_age_seconds",
     T::kGauge,
     {"rank", "local_rank"},
     "seconds",
     "Since the rank last wrote to stdout or stderr (-1: never)"},
    {"ddprun_rank_collectives_total",
     T::kCounter,
     {"rank", "local_rank"},
     "",
     "Collectives the rank completed (libddp programs)"},
    {"ddprun_rank_collective_wait_seconds_total",
     T::kCounter,
     {"rank", "local_rank"},
     "seconds",
     "Time the rank spent inside collectives (libddp programs)"},
    {"ddprun_rank_steps_total",
     T::kCounter,
     {"rank", "local_rank"},
     "",
     "Training steps the rank finished: synchronising GradSync or SharedGradSum finish "
     "calls (libddp programs)"},
    {"ddprun_rank_step_median_seconds",
     T::kGauge,
     {"rank", "local_rank"},
     "seconds",
     "Median time from one step's end to the next's, over the rank's last 128 steps (libddp "
     "programs; 0 until two steps ended)"},
    {"ddprun_rank_step_p99_seconds",
     T::kGauge,
     {"rank", "local_rank"},
     "seconds",
     "99th percentile (nearest rank) of the same step times"},
    {"ddprun_rank_in_collective_seconds",
     T::kGauge,
     {"rank", "local_rank"},
     "seconds",
     "How long the rank has been inside its current collective (0: outside)"},
    {"ddprun_rank_straggler_score",
     T::kGauge,
     {"rank", "local_rank"},
     "ratio",
     "Share of wall time the node's other ranks waited for this rank to arrive at "
     "collectives (median over --straggler_window; libddp programs)"},
    {"ddprun_rank_straggler",
     T::kGauge,
     {"rank", "local_rank"},
     "",
     "1 while the rank is named a straggler"},
    {"ddprun_node_straggler_score",
     T::kGauge,
     {"node", "host"},
     "ratio",
     "Share of wall time the other nodes waited for this node's ranks (judged at the "
     "rendezvous: exported by the node that hosts it; libddp programs)"},
    {"ddprun_node_straggler",
     T::kGauge,
     {"node", "host"},
     "",
     "1 while the node is named a straggler at the rendezvous"},
    {"ddprun_stragglers_named_total",
     T::kCounter,
     {},
     "",
     "Times a rank of this node was named a straggler"},
};

}  // namespace

const std::vector<MetricDef>& metric_defs() { return kMetricDefs; }

std::vector<MetricSample> metric_samples(const NodeStatus& node, const NodeCounters& c,
                                         const NodeExtras& extras) {
  std::vector<MetricSample> out;
  auto add = [&](const char* name, double v,
                 std::vector<std::pair<std::string, std::string>> l = {}) {
    out.push_back({name, std::move(l), v});
  };
  add("ddprun_info", 1);
  add("ddprun_uptime_seconds", node.age_s);
  add("ddprun_round", static_cast<double>(node.round));
  add("ddprun_rounds_total", static_cast<double>(c.rounds));
  add("ddprun_world_size", node.world_size);
  add("ddprun_nodes", extras.nodes);
  add("ddprun_local_world_size", static_cast<double>(node.ranks.size()));
  add("ddprun_max_restarts", extras.max_restarts);
  for (const char* reason : {"worker_failure", "hang", "other_node"}) {
    auto it = c.restarts.find(reason);
    add("ddprun_restarts_total", it == c.restarts.end() ? 0 : static_cast<double>(it->second),
        {{"reason", reason}});
  }
  add("ddprun_heal_relaunches_total", static_cast<double>(c.relaunches));
  add("ddprun_hangs_total", static_cast<double>(c.hangs));
  add("ddprun_failures_total", static_cast<double>(c.failures));
  add("ddprun_worker_starts_total", static_cast<double>(c.worker_starts));
  for (const char* outcome : {"succeeded", "failed", "signaled"}) {
    auto it = c.worker_exits.find(outcome);
    add("ddprun_worker_exits_total",
        it == c.worker_exits.end() ? 0 : static_cast<double>(it->second), {{"outcome", outcome}});
  }
  std::map<std::string, int> by_state;
  for (RankState s : {RankState::kStarting, RankState::kRunning, RankState::kInCollective,
                      RankState::kStopped, RankState::kExited}) {
    by_state[rank_state_name(s)] = 0;
  }
  for (const auto& r : node.ranks) ++by_state[rank_state_name(r.state)];
  for (const auto& [state, n] : by_state) add("ddprun_workers", n, {{"state", state}});
  add("ddprun_heartbeat_age_seconds", extras.heartbeat_age_s);
  add("ddprun_events_dropped_total", static_cast<double>(c.events_dropped));
  add("ddprun_stragglers_named_total", static_cast<double>(c.stragglers_named));
  for (const auto& n : extras.node_stragglers) {
    const std::vector<std::pair<std::string, std::string>> l = {{"node", std::to_string(n.node)},
                                                                {"host", n.host}};
    add("ddprun_node_straggler_score", n.score, l);
    add("ddprun_node_straggler", n.named ? 1 : 0, l);
  }
  for (const auto& r : node.ranks) {
    std::vector<std::pair<std::string, std::string>> l = {
        {"rank", std::to_string(r.rank)}, {"local_rank", std::to_string(r.local_rank)}};
    const bool up = r.state != RankState::kExited;
    add("ddprun_rank_up", up ? 1 : 0, l);
    add("ddprun_rank_cpu_usage_ratio", r.cpu_percent / 100.0, l);
    add("ddprun_rank_resident_memory_bytes", static_cast<double>(r.rss_bytes), l);
    add("ddprun_rank_last_output_age_seconds", r.last_output_age_s, l);
    add("ddprun_rank_collectives_total", static_cast<double>(r.collectives_done), l);
    add("ddprun_rank_collective_wait_seconds_total", r.collective_wait_s, l);
    add("ddprun_rank_steps_total", static_cast<double>(r.steps), l);
    add("ddprun_rank_step_median_seconds", r.step_median_s, l);
    add("ddprun_rank_step_p99_seconds", r.step_p99_s, l);
    add("ddprun_rank_in_collective_seconds",
        r.state == RankState::kInCollective ? r.in_collective_s : 0, l);
    add("ddprun_rank_straggler_score", r.straggler_score, l);
    add("ddprun_rank_straggler", r.straggler ? 1 : 0, l);
  }
  return out;
}

}  // namespace ddp::launcher
