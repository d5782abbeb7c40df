// NodeStragglerDetector with made-up node reports and a made-up clock: a
// node the other nodes wait for 20% of the time is named within the window
// (a node of one rank, a whole slow node of two), each node reporting at its
// own moments; noise names nobody; a restarted node or a new round starts
// the comparison again.

#include "observe/node_straggler_detector.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace ddp::launcher {
namespace {

using Clock = NodeStragglerDetector::Clock;
using namespace std::chrono_literals;

// A job of `nodes` nodes of `per_node` libddp ranks, 1,000 collectives a
// second. Each collective ends for every rank at once, so a node that
// arrives `late` seconds per second after the others makes each of the
// others wait that long more, per second, than its own ranks do; every
// rank's wait also jitters by up to `noise` seconds per second.
class Job {
 public:
  Job(int nodes, int per_node, unsigned seed = 1) : rng_(seed) {
    for (int n = 0; n < nodes; ++n) {
      NodeStatus s;
      s.node_rank = n;
      s.host = "host" + std::to_string(n);
      s.round = 1;
      for (int l = 0; l < per_node; ++l) {
        RankStatus r;
        r.rank = n * per_node + l;
        r.local_rank = l;
        r.pid = 100 + r.rank;
        r.libddp = true;
        r.state = RankState::kRunning;
        s.ranks.push_back(r);
      }
      nodes_.push_back(s);
    }
  }
  // One second: every node reports once, node n `n` x 100 ms into it;
  // `late`: per node, as every rank of it.
  std::vector<NodeStragglerChange> second(NodeStragglerDetector& d, const std::vector<double>& late,
                                          double noise = 0.02) {
    std::vector<double> by_rank;
    for (std::size_t n = 0; n < nodes_.size(); ++n) {
      for (std::size_t l = 0; l < nodes_[n].ranks.size(); ++l) {
        by_rank.push_back(n < late.size() ? late[n] : 0);
      }
    }
    return second_by_rank(d, by_rank, noise);
  }
  // The same with `late` per global rank.
  std::vector<NodeStragglerChange> second_by_rank(NodeStragglerDetector& d,
                                                  const std::vector<double>& late, double noise) {
    std::uniform_real_distribution<double> u(0, noise);
    std::vector<NodeStragglerChange> out;
    now_ += 1s;
    double latest = 0;
    for (double l : late) latest = std::max(latest, l);
    for (std::size_t n = 0; n < nodes_.size(); ++n) {
      for (auto& r : nodes_[n].ranks) {
        const double own = static_cast<std::size_t>(r.rank) < late.size() ? late[r.rank] : 0;
        r.collectives_done += 1000;
        r.collective_wait_s += 0.1 + (latest - own) + u(rng_);
      }
      auto changes = d.observe(now_ + std::chrono::milliseconds(100 * n), nodes_[n]);
      out.insert(out.end(), changes.begin(), changes.end());
    }
    return out;
  }
  std::vector<NodeStatus>& nodes() { return nodes_; }

 private:
  std::vector<NodeStatus> nodes_;
  std::mt19937 rng_;
  Clock::time_point now_{};
};

int changes_of(const std::vector<NodeStragglerChange>& changes, int node, bool named) {
  int n = 0;
  for (const auto& c : changes) n += c.node == node && c.named == named;
  return n;
}

TEST(NodeStragglerDetector, TheOneRankOfASlowNodeIsNamedWithinTheWindow) {
  NodeStragglerDetector d;  // 40 intervals, a verdict from 20
  Job job(2, 1);
  int named_at = -1;
  for (int s = 1; s <= 40 && named_at < 0; ++s) {
    auto changes = job.second(d, {0, 0.2});
    EXPECT_EQ(changes_of(changes, 0, true), 0) << "node 0 named at second " << s;
    if (changes_of(changes, 1, true) == 1) {
      named_at = s;
      EXPECT_NE(changes[0].evidence.find("node 1 (host host1, ranks 1)"), std::string::npos)
          << changes[0].evidence;
    }
  }
  ASSERT_GT(named_at, 0) << "never named";
  EXPECT_LE(named_at, 22);
  EXPECT_TRUE(d.named(1));
  EXPECT_NEAR(d.score(1), 0.2, 0.03);
  EXPECT_EQ(d.score(0), 0);
}

TEST(NodeStragglerDetector, AWholeSlowNodeOfSeveralRanksIsNamedAndTheOthersAreNot) {
  NodeStragglerDetector d;
  Job job(3, 2);
  for (int s = 0; s < 40; ++s) {
    for (const auto& c : job.second(d, {0, 0, 0.15})) {
      EXPECT_EQ(c.node, 2) << c.evidence;
    }
  }
  EXPECT_TRUE(d.named(2));
  EXPECT_FALSE(d.named(0));
  EXPECT_FALSE(d.named(1));
  // It recovers: cleared once the median share falls under the clearing share.
  bool cleared = false;
  for (int s = 0; s < 40 && !cleared; ++s) cleared = changes_of(job.second(d, {}), 2, false) == 1;
  EXPECT_TRUE(cleared);
}

TEST(NodeStragglerDetector, OneSlowRankAmongOthersOnItsNodeIsLeftToThatNode) {
  NodeStragglerDetector d;
  Job job(2, 2);  // ranks 0-1 on node 0, 2-3 on node 1
  for (int s = 0; s < 60; ++s) {
    for (const auto& c : job.second_by_rank(d, {0, 0, 0, 0.2}, 0.02)) ADD_FAILURE() << c.evidence;
  }
  EXPECT_LT(d.score(1), 0.05);
}

TEST(NodeStragglerDetector, NoiseNamesNobody) {
  NodeStragglerDetector d;
  Job job(4, 2, 7);
  for (int s = 0; s < 600; ++s) {
    for (const auto& c : job.second(d, {}, 0.04)) ADD_FAILURE() << c.evidence;
  }
}

TEST(NodeStragglerDetector, ARestartedNodeAndANewRoundStartOver) {
  NodeStragglerDetector d;
  Job job(2, 1);
  for (int s = 0; s < 30; ++s) job.second(d, {0.2, 0});
  ASSERT_TRUE(d.named(0));
  // Node 1's rank was relaunched: a new pid, its counters from zero.
  job.nodes()[1].ranks[0].pid = 999;
  job.nodes()[1].ranks[0].collectives_done = 0;
  job.nodes()[1].ranks[0].collective_wait_s = 0;
  auto changes = job.second(d, {0.2, 0});
  EXPECT_EQ(changes_of(changes, 0, false), 1);
  EXPECT_FALSE(d.named(0));
  for (int s = 0; s < 30; ++s) job.second(d, {0.2, 0});
  ASSERT_TRUE(d.named(0));
  for (auto& n : job.nodes()) n.round = 2;
  changes = job.second(d, {0.2, 0});
  EXPECT_EQ(changes_of(changes, 0, false), 1);
  EXPECT_EQ(d.score(0), 0);
}

}  // namespace
}  // namespace ddp::launcher
