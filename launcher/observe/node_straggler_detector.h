#pragma once
// Names a node whose ranks the other nodes' ranks persistently wait for: a
// whole slow host, or the only rank of its node, which the ranks of one node
// compared among themselves (straggler_detector.h) cannot see. Runs where
// every node's report arrives: the rendezvous. Pure logic, unit-tested with
// made-up reports and a made-up clock.
//
// The signal. Ranks on different hosts share no clock, but a collective ends
// for all its ranks at about the same moment, so the time a rank spends
// inside a collective is how much earlier than the last rank it arrived.
// Over an interval (between two reports of a node), a node's wait per
// collective is the largest of its libddp ranks' (their wait's growth over
// their collectives'): that of its earliest rank, so a node is late only
// when all its ranks are (one slow rank among others on its node makes them
// wait like everyone else, and is the node's own detector's to name). A
// node's lateness per collective is the median of the other nodes' waits
// less its own, and its share is that lateness times its collectives per
// second: the share of time the other nodes waited for it.
// An interval is complete once every node reported since the previous one;
// the verdict is straggler_judge.h's.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "observe/job_status.h"
#include "observe/straggler_judge.h"

namespace ddp::launcher {

// A node named, or one that recovered.
struct NodeStragglerChange {
  int node = 0;  // group rank
  bool named = false;
  double score = 0;
  // E.g. "node 1 (host b, ranks 2-3) arrived last in 19 of the last 20
  // intervals (1.0 s each): the other nodes waited for it 17.9% of the time
  // (median), 0.210 ms per collective over 8500 collectives".
  std::string evidence;
};

// A node's standing: its score and whether it is named.
struct NodeStragglerScore {
  int node = 0;
  std::string host;
  double score = 0;
  bool named = false;
};

class NodeStragglerDetector {
 public:
  using Clock = std::chrono::steady_clock;
  explicit NodeStragglerDetector(StragglerRule rule = {}) : judge_(rule) {}

  // Node `node.node_rank`'s report, received at `now`. Returns the nodes
  // named or cleared once it completes an interval.
  std::vector<NodeStragglerChange> observe(Clock::time_point now, const NodeStatus& node);

  double score(int node) const;
  bool named(int node) const { return judge_.named(node); }
  // Every node reported in the current round, by group rank.
  std::vector<NodeStragglerScore> scores() const;

 private:
  struct Mark {
    Clock::time_point at;
    std::vector<int> pids;  // a new pid (a restart) starts the comparison again
    std::vector<std::uint64_t> collectives;
    std::vector<double> wait_s;
  };
  struct Node {
    std::string host;
    std::vector<int> ranks;
    std::optional<Mark> from;  // the previous interval's end
    Mark latest;
  };
  static Mark mark_of(Clock::time_point now, const NodeStatus& node);
  bool interval_complete() const;
  void add_interval();
  std::vector<NodeStragglerChange> reset(const std::string& why);
  std::string evidence(std::size_t index, int node) const;

  StragglerJudge judge_;
  std::map<int, Node> nodes_;  // by group rank
  std::int64_t round_ = 0;
};

}  // namespace ddp::launcher
