// The hang detector's rules (what counts as progress, whom to blame) and the
// hang report's shape, with made-up samples and an injected clock.

#include "observe/hang_detector.h"

#include <gtest/gtest.h>

#include "worker_group/failure_report.h"

namespace ddp::launcher {
namespace {

using namespace std::chrono_literals;
using Clock = HangDetector::Clock;

RankSample libddp(int rank, std::uint64_t begun, std::uint64_t completed, std::uint64_t cpu = 0) {
  RankSample s;
  s.rank = rank;
  s.libddp = true;
  s.begun = begun;
  s.completed = completed;
  s.op = ProgressOp::kAllReduce;
  s.cpu_ticks = cpu;
  return s;
}

RankSample program(int rank, std::uint64_t cpu) {
  RankSample s;
  s.rank = rank;
  s.cpu_ticks = cpu;
  return s;
}

TEST(HangDetector, CpuTimeIsProgressForAnyProgram) {
  HangDetector d(10s);
  const auto t0 = Clock::now();
  EXPECT_FALSE(d.observe(t0, {program(0, 1), program(1, 1)}));
  EXPECT_FALSE(d.observe(t0 + 6s, {program(0, 5), program(1, 1)}));
  EXPECT_FALSE(d.observe(t0 + 9s, {program(0, 9), program(1, 1)}));
  auto v = d.observe(t0 + 10s, {program(0, 12), program(1, 1)});
  ASSERT_TRUE(v);
  EXPECT_EQ(v->stuck, std::vector<int>{1});
  EXPECT_EQ(v->blamed, std::vector<int>{1});
  ASSERT_EQ(v->lines.size(), 1u);
  EXPECT_EQ(v->lines[0], "rank 1: used no CPU time");
}

TEST(HangDetector, SpinningInsideACollectiveIsNotProgressButComputingOutsideOneIs) {
  HangDetector d(5s);
  const auto t0 = Clock::now();
  // Rank 0 waits in all_reduce #4 (its CPU time grows: it spins); rank 1
  // computes between collectives #3 and #4.
  d.observe(t0, {libddp(0, 4, 3, 100), libddp(1, 3, 3, 100)});
  EXPECT_FALSE(d.observe(t0 + 3s, {libddp(0, 4, 3, 200), libddp(1, 3, 3, 200)}));
  auto v = d.observe(t0 + 5s, {libddp(0, 4, 3, 300), libddp(1, 3, 3, 300)});
  ASSERT_TRUE(v);
  EXPECT_EQ(v->stuck, std::vector<int>{0});
  // Rank 0 waits for rank 1, which is to blame although it is busy.
  EXPECT_EQ(v->blamed, std::vector<int>{1});
  EXPECT_EQ(v->lines[0],
            "rank 1: busy or blocked outside libddp, between collectives (3 done); rank 0 waits "
            "for it in "
            "all_reduce #4");
  EXPECT_FALSE(v->waits_elsewhere);
}

TEST(HangDetector, AStoppedRankIsBlamedAndEveryWaiterListed) {
  HangDetector d(2s);
  const auto t0 = Clock::now();
  std::vector<RankSample> s = {libddp(4, 8, 7), libddp(5, 7, 7), libddp(6, 8, 7), libddp(7, 8, 7)};
  s[1].stopped = true;
  d.observe(t0, s);
  auto v = d.observe(t0 + 2s, s);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->stuck, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(v->blamed, std::vector<int>{1});
  EXPECT_EQ(v->lines[0],
            "rank 5: stopped (SIGSTOP or a debugger), between collectives (7 done); ranks 4, 6, 7 "
            "wait for it in "
            "all_reduce #8");
}

TEST(HangDetector, ProgressOfOneCollectiveResetsTheClock) {
  HangDetector d(2s);
  const auto t0 = Clock::now();
  d.observe(t0, {libddp(0, 1, 0), libddp(1, 1, 0)});
  EXPECT_FALSE(d.observe(t0 + 1500ms, {libddp(0, 1, 1), libddp(1, 1, 1)}));
  EXPECT_FALSE(d.observe(t0 + 3000ms, {libddp(0, 2, 1), libddp(1, 2, 1)}));
  EXPECT_FALSE(d.observe(t0 + 4900ms, {libddp(0, 2, 1), libddp(1, 2, 1)}));
  EXPECT_TRUE(d.observe(t0 + 5000ms, {libddp(0, 2, 1), libddp(1, 2, 1)}));
}

TEST(HangDetector, StuckInACollectiveEveryLocalRankBeganPointsElsewhere) {
  HangDetector d(1s);
  const auto t0 = Clock::now();
  std::vector<RankSample> s = {libddp(2, 9, 8), libddp(3, 9, 8)};
  d.observe(t0, s);
  auto v = d.observe(t0 + 1s, s);
  ASSERT_TRUE(v);
  EXPECT_TRUE(v->waits_elsewhere);
  EXPECT_EQ(v->blamed, (std::vector<int>{0, 1}));
  EXPECT_EQ(v->lines[0], "rank 2: uses no CPU, in all_reduce #9");
  EXPECT_NE(v->lines.back().find("wait for a rank on another node"), std::string::npos);
}

TEST(HangDetector, AnExitedRankIsNeverStuckButCanBeWaitedFor) {
  HangDetector d(1s);
  const auto t0 = Clock::now();
  RankSample gone = libddp(1, 3, 3);
  gone.exited = true;
  d.observe(t0, {libddp(0, 4, 3), gone});
  auto v = d.observe(t0 + 1s, {libddp(0, 4, 3), gone});
  ASSERT_TRUE(v);
  EXPECT_EQ(v->stuck, std::vector<int>{0});
  EXPECT_EQ(v->blamed, std::vector<int>{1});
  EXPECT_EQ(v->lines[0],
            "rank 1: exited, after 3 collective(s); rank 0 waits for it in all_reduce #4");
}

TEST(HangDetector, RankListJoinsRuns) {
  EXPECT_EQ(rank_list({}), "");
  EXPECT_EQ(rank_list({3}), "3");
  EXPECT_EQ(rank_list({2, 0}), "0, 2");
  EXPECT_EQ(rank_list({0, 1}), "0, 1");
  EXPECT_EQ(rank_list({5, 0, 1, 2, 3, 7, 8}), "0-3, 5, 7, 8");
}

TEST(HangReport, HeadlineNamesTheBlamedRanksThenWhatThenStacks) {
  WorkerOutcome w;
  w.rank = 9;
  w.local_rank = 1;
  w.pid = 1234;
  w.host = "node-b";
  w.hung = true;
  EXPECT_EQ(w.launcher_exit_code(), 124);
  EXPECT_TRUE(w.failed());
  std::vector<std::string> many(50, "frame");
  std::string report =
      format_hang_report({w}, 30, {"rank 9: stopped"}, {{9, "native stacks", many}}, 0, 2, 40);
  EXPECT_EQ(report.substr(0, report.find('\n')),
            "worker group hung (no progress for 30 s, --hang_timeout): rank 9 (local rank 1, pid "
            "1234, host "
            "node-b) [attempt 1 of 3]");
  EXPECT_NE(report.find("\n  rank 9: stopped\n  rank 9, native stacks:\n  | frame"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("  | ... 10 more line(s)"), std::string::npos) << report;
}

}  // namespace
}  // namespace ddp::launcher
