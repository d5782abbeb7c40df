#pragma once
// The Prometheus metric set of one ddprun (one node): every series' name,
// type, labels, unit and help (documented in docs/observability.md, checked
// by a test), and the samples computed from a node's status and its agent's
// counters. Pure logic; observe/metrics_server exposes the samples with
// prometheus-cpp. Unit-tested (tests/unit/launcher/observe/observability_test.cc).

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "observe/job_status.h"
#include "observe/node_straggler_detector.h"

namespace ddp::launcher {

enum class MetricType { kGauge, kCounter };

struct MetricDef {
  std::string name;
  MetricType type;
  std::vector<std::string> labels;  // beyond the constant ones (run_id, host, node_rank)
  std::string unit;
  std::string help;
};
const std::vector<MetricDef>& metric_defs();

// What the agent counts as the job runs (the event log's events).
struct NodeCounters {
  std::int64_t rounds = 0;
  std::map<std::string, std::int64_t> restarts;  // by reason: worker_failure, hang, other_node
  std::int64_t relaunches = 0;
  std::int64_t hangs = 0;
  std::int64_t worker_starts = 0;
  std::map<std::string, std::int64_t> worker_exits;  // by outcome: succeeded, failed, signaled
  std::int64_t failures = 0;
  std::int64_t events_dropped = 0;
  std::int64_t stragglers_named = 0;
};

struct MetricSample {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;
  double value = 0;
};

struct NodeExtras {
  int nodes = 1;  // in the round
  int max_restarts = 0;
  double heartbeat_age_s = 0;  // since the last answered heartbeat (0 on a single node)
  // Where this node hosts the rendezvous: every node's standing as a straggler.
  std::vector<NodeStragglerScore> node_stragglers;
};

// Every sample of the set for this node now.
std::vector<MetricSample> metric_samples(const NodeStatus& node, const NodeCounters& counters,
                                         const NodeExtras& extras);

}  // namespace ddp::launcher
