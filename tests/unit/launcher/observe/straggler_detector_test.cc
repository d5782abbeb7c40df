// StragglerDetector with made-up samples and a made-up clock: a rank the
// others wait for 20% longer is named within the window, noise and spikes
// never name anyone, a recovered rank is cleared, a restart starts over.

#include "observe/straggler_detector.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace ddp::launcher {
namespace {

using Clock = StragglerDetector::Clock;
using namespace std::chrono_literals;

// A node of `n` ranks sampled once a second, 500 collectives an interval.
// `late[i]`: seconds of the interval the others spend waiting for rank i to
// arrive; each rank's arrivals also jitter by up to `noise` seconds in all.
class Node {
 public:
  explicit Node(int n, unsigned seed = 1) : ranks_(n), rng_(seed) {
    for (int i = 0; i < n; ++i) {
      ranks_[i].rank = i;
      ranks_[i].pid = 100 + i;
      // Near the top of the range: the sums wrap within the first intervals.
      ranks_[i].arrivals = ArrivalMark{0, UINT64_MAX - 3'000'000'000ull, 0};
    }
  }
  std::vector<StragglerChange> step(StragglerDetector& d, const std::vector<double>& late,
                                    double noise = 0.05) {
    std::uniform_real_distribution<double> u(0, noise);
    now_ += 1s;
    const auto now_ns = static_cast<std::uint64_t>(now_.time_since_epoch().count());
    for (std::size_t i = 0; i < ranks_.size(); ++i) {
      ArrivalMark& m = *ranks_[i].arrivals;
      const double own = (i < late.size() ? late[i] : 0) + u(rng_);
      m.seq += 500;
      m.sum += 500 * now_ns + static_cast<std::uint64_t>(own * 1e9);
      m.last_ns = now_ns;
    }
    return d.observe(now_, ranks_);
  }
  std::vector<StragglerSample>& ranks() { return ranks_; }

 private:
  std::vector<StragglerSample> ranks_;
  std::mt19937 rng_;
  Clock::time_point now_{};
};

int named_in(const std::vector<StragglerChange>& changes, int rank, bool named) {
  int n = 0;
  for (const auto& c : changes) n += c.rank == rank && c.named == named;
  return n;
}

TEST(StragglerDetector, ARankTheOthersWaitForTwentyPercentIsNamedWithinTheWindow) {
  StragglerDetector d;
  Node node(2);
  int named_at = -1;
  std::vector<StragglerChange> all;
  for (int t = 0; t < 40; ++t) {
    auto c = node.step(d, {0, 0.2});
    all.insert(all.end(), c.begin(), c.end());
    if (named_at < 0 && d.named(1)) named_at = t;
  }
  ASSERT_GE(named_at, 0);
  EXPECT_LE(named_at, StragglerRule{}.window);
  EXPECT_EQ(named_in(all, 1, true), 1);  // said once, not every sample
  EXPECT_EQ(named_in(all, 0, true), 0);
  EXPECT_FALSE(d.named(0));
  EXPECT_NEAR(d.score(1), 0.2, 0.05);
  EXPECT_EQ(d.score(0), 0);
  for (const auto& c : all) {
    if (!c.named) continue;
    EXPECT_NE(c.evidence.find("rank 1 arrived last in "), std::string::npos) << c.evidence;
    EXPECT_NE(c.evidence.find("the others waited for it"), std::string::npos) << c.evidence;
    // 0.2 s late an interval over 500 collectives: 0.4 ms each.
    EXPECT_NE(c.evidence.find(" ms after them per collective"), std::string::npos) << c.evidence;
  }
}

TEST(StragglerDetector, FourRanksNameOnlyTheSlowOne) {
  StragglerDetector d;
  Node node(4, 7);
  for (int t = 0; t < 30; ++t) node.step(d, {0, 0, 0.15, 0});
  EXPECT_TRUE(d.named(2));
  for (int r : {0, 1, 3}) EXPECT_FALSE(d.named(r)) << r;
}

TEST(StragglerDetector, NoiseAndSpikesNeverNameAnyone) {
  StragglerDetector d;
  Node node(2, 3);
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> who(0, 1);
  for (int t = 0; t < 3000; ++t) {
    std::vector<double> late = {0, 0};
    // Every 7th interval one rank stalls for most of it (a page fault storm,
    // a noisy neighbour): a spike, never a trend.
    if (t % 7 == 0) late[who(rng)] = 0.9;
    auto c = node.step(d, late, 0.15);
    ASSERT_TRUE(c.empty()) << "interval " << t << ": " << c[0].evidence;
  }
}

TEST(StragglerDetector, StreaksOfEitherRankAreNotATrend) {
  // A busy neighbour that moves between the cores: rank 1 late 60% of the
  // time, rank 0 the rest. The median leans to rank 1, but it is not last
  // in four fifths of the window.
  StragglerDetector d;
  Node node(2);
  for (int t = 0; t < 400; ++t) {
    const bool one = t % 10 < 6;
    auto c = node.step(d, one ? std::vector<double>{0, 0.3} : std::vector<double>{0.3, 0});
    ASSERT_TRUE(c.empty()) << "interval " << t << ": " << c[0].evidence;
  }
  EXPECT_GT(d.score(1), StragglerRule{}.name_share);  // the score itself does show it
}

TEST(StragglerRule, TheWindowIsCountedInSamples) {
  EXPECT_EQ(straggler_rule(40, 1).window, 40);
  EXPECT_EQ(straggler_rule(40, 1).min_intervals, 20);
  EXPECT_EQ(straggler_rule(40, 0.5).window, 80);
  EXPECT_EQ(straggler_rule(10, 5).window, 4);  // never fewer than 4
}

TEST(StragglerDetector, ARecoveredRankIsCleared) {
  StragglerDetector d;
  Node node(2);
  for (int t = 0; t < 30; ++t) node.step(d, {0.25, 0});
  ASSERT_TRUE(d.named(0));
  int cleared = 0;
  for (int t = 0; t < 30; ++t) cleared += named_in(node.step(d, {0, 0}), 0, false);
  EXPECT_EQ(cleared, 1);
  EXPECT_FALSE(d.named(0));
  EXPECT_LT(d.score(0), StragglerRule{}.clear_share);
}

TEST(StragglerDetector, AScoreBetweenTheThresholdsKeepsTheVerdict) {
  StragglerDetector d;
  Node node(2);
  for (int t = 0; t < 30; ++t) node.step(d, {0, 0.2});
  ASSERT_TRUE(d.named(1));
  // 6%: under the naming threshold, over the clearing one.
  for (int t = 0; t < 40; ++t) EXPECT_TRUE(node.step(d, {0, 0.06}, 0.0).empty());
  EXPECT_TRUE(d.named(1));
}

TEST(StragglerDetector, ARestartedRankStartsOver) {
  StragglerDetector d;
  Node node(2);
  for (int t = 0; t < 30; ++t) node.step(d, {0, 0.3});
  ASSERT_TRUE(d.named(1));
  node.ranks()[1].pid = 999;  // relaunched: its counters start again
  node.ranks()[1].arrivals = ArrivalMark{0, 0, 0};
  auto c = node.step(d, {0, 0});
  EXPECT_EQ(named_in(c, 1, false), 1);
  EXPECT_FALSE(d.named(1));
  EXPECT_EQ(d.score(1), 0);
}

TEST(StragglerDetector, SamplesWithoutArrivalsOrCollectivesTellNothing) {
  StragglerDetector d;
  Node node(2);
  node.ranks()[1].arrivals.reset();  // not on the board (an older libddp, not libddp)
  for (int t = 0; t < 30; ++t) EXPECT_TRUE(node.step(d, {0, 0.5}).empty());
  EXPECT_EQ(d.score(1), 0);
  StragglerDetector idle;
  std::vector<StragglerSample> quiet = {{0, 1, ArrivalMark{5, 50, 10}},
                                        {1, 2, ArrivalMark{5, 70, 14}}};
  Clock::time_point t{};
  for (int i = 0; i < 30; ++i) EXPECT_TRUE(idle.observe(t += 1s, quiet).empty());
  EXPECT_EQ(idle.score(0), 0);
}

TEST(CommonArrivals, ARankOneCollectiveAheadGivesBackItsLastArrival) {
  std::vector<StragglerSample> s = {{0, 1, ArrivalMark{7, 700, 100}},
                                    {1, 2, ArrivalMark{8, 830, 120}}};
  auto c = common_arrivals(s);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->seq, 7u);
  EXPECT_EQ(c->sums, (std::vector<std::uint64_t>{700, 710}));
  s[1].arrivals->seq = 9;  // two ahead: its sum at 7 is unknown
  EXPECT_FALSE(common_arrivals(s));
  s[1].arrivals.reset();
  EXPECT_FALSE(common_arrivals(s));
}

TEST(StragglerDetector, OneRankAloneIsNeverJudged) {
  StragglerDetector d;
  Node node(1);
  for (int t = 0; t < 30; ++t) EXPECT_TRUE(node.step(d, {0.5}).empty());
}

}  // namespace
}  // namespace ddp::launcher
