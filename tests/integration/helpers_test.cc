// libddp's helpers and C API in real jobs: ddprun starting 2 or 3 workers
// (helpers_worker, c_api_worker, a ctypes script) that rendezvous and talk
// over Gloo. Every run is bounded (collective timeout 30 s, job 90 s).

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "run_ddprun.h"
#include "subprocess.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
const std::string kHelpers = HELPERS_WORKER_PATH;
const std::string kCWorker = C_API_WORKER_PATH;
const std::string kCtypesScript = C_API_CTYPES_PATH;
const std::string kLibddp = LIBDDP_PATH;
const std::string kPython = "/usr/bin/python3";

ProcessResult run_workers(int nproc, std::vector<std::string> program,
                          std::vector<std::string> flags = {}) {
  std::vector<std::string> args = {"--nproc_per_node=" + std::to_string(nproc)};
  args.insert(args.end(), flags.begin(), flags.end());
  args.insert(args.end(), program.begin(), program.end());
  return ddprun(args, {{"DDP_BACKEND", "gloo"}, {"DDP_TIMEOUT_S", "30"}, {"DDP_LOG_LEVEL", "\x01"}},
                90s);
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::vector<std::string> rank_lines(const std::string& out, int rank, const std::string& head) {
  return lines_with_prefix(out, "[rank " + std::to_string(rank) + "] " + head);
}

// Every rank printed at least one CHECK line and none failed.
void expect_checks_pass(const ProcessResult& r, int nproc) {
  ASSERT_TRUE(r.exited) << "timed out\n" << r.out << r.err;
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  for (int rank = 0; rank < nproc; ++rank) {
    auto checks = rank_lines(r.out, rank, "CHECK ");
    EXPECT_FALSE(checks.empty()) << "rank " << rank << "\n" << r.out << r.err;
    for (const auto& c : checks)
      EXPECT_TRUE(c.size() > 3 && c.substr(c.size() - 3) == " ok") << "rank " << rank << ": " << c;
  }
}

class Worlds : public ::testing::TestWithParam<int> {};

TEST(HelpersLog, OnlyRankZeroInfoAppearsAndEveryRanksWarningsDo) {
  auto r = run_workers(3, {kHelpers, "log", "rank0"});
  ASSERT_TRUE(r.exited);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "[rank 0] INFO-ONE from 0\n")) << r.out;
  EXPECT_FALSE(has(r.out, "INFO-ONE from 1")) << r.out;
  EXPECT_FALSE(has(r.out, "INFO-ONE from 2")) << r.out;
  EXPECT_TRUE(has(r.out, "[rank 0] DEBUG: DEBUG-SHOWN from 0\n")) << r.out;
  EXPECT_FALSE(has(r.out, "DEBUG-SHOWN from 1")) << r.out;
  EXPECT_FALSE(has(r.out + r.err, "DEBUG-HIDDEN")) << r.out;
  EXPECT_FALSE(has(r.err, "WARN-HIDDEN")) << r.err;
  for (int rank = 0; rank < 3; ++rank) {
    std::string tag = "[rank " + std::to_string(rank) + "] ";
    std::string n = std::to_string(rank);
    // The launcher's console prefix alone: libddp leaves the rank out of its
    // own when ddprun prefixes (DDP_OUTPUT_PREFIXED), so it is not repeated.
    EXPECT_TRUE(has(r.out, tag + "INFO-ALL from " + n + "\n")) << r.out;
    EXPECT_TRUE(has(r.err, tag + "WARNING: WARN from " + n + "\n")) << r.err;
    EXPECT_TRUE(has(r.err, tag + "ERROR: ERR from " + n + "\n")) << r.err;
    EXPECT_FALSE(has(r.out + r.err, tag + tag)) << r.out << r.err;
    EXPECT_FALSE(has(r.err, tag + "INFO")) << r.err;  // info stays on stdout
  }
}

TEST(HelpersLog, WithoutTheLaunchersPrefixLinesStillTellRanksApart) {
  auto r = run_workers(2, {kHelpers, "log", "rank0"}, {"--no-prefix"});
  ASSERT_TRUE(r.exited);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "INFO-ONE from 0\n")) << r.out;
  EXPECT_FALSE(has(r.out, "INFO-ONE from 1")) << r.out;
  EXPECT_TRUE(has(r.out, "[rank 1] INFO-ALL from 1\n")) << r.out;
  EXPECT_TRUE(has(r.err, "[rank 1] WARNING: WARN from 1\n")) << r.err;
}

TEST_P(Worlds, ReduceSumAndMean) {
  auto r = run_workers(GetParam(), {kHelpers, "collectives"});
  expect_checks_pass(r, GetParam());
}

TEST_P(Worlds, BroadcastParamsAndSyncBuffers) {
  auto r = run_workers(GetParam(), {kHelpers, "sync"});
  expect_checks_pass(r, GetParam());
}

TEST_P(Worlds, CheckSameParamsNamesRankOneAndTheParameterOnEveryRank) {
  const int n = GetParam();
  auto r = run_workers(n, {kHelpers, "params-mismatch"});
  expect_checks_pass(r, n);
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_EQ(rank_lines(r.out, rank, "ERROR "),
              std::vector<std::string>{"check_same_params: parameter 2 'fc2.weight': rank 1 has "
                                       "shape [10, 20], rank 0 has [10, 21]"})
        << r.out;
  }
}

INSTANTIATE_TEST_SUITE_P(Helpers, Worlds, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "world" + std::to_string(info.param);
                         });

TEST(HelpersMetrics, AverageMetricsIsWeightedByEachRanksCount) {
  auto r = run_workers(3, {kHelpers, "metrics"});
  expect_checks_pass(r, 3);
  // Rank k: count k + 1, loss 1 + k, acc k / 10.
  double weight = 0, loss = 0, acc = 0;
  for (int k = 0; k < 3; ++k) {
    weight += k + 1;
    loss += (1.0 + k) * (k + 1);
    acc += (k / 10.0) * (k + 1);
  }
  for (int rank = 0; rank < 3; ++rank) {
    auto lines = rank_lines(r.out, rank, "METRIC ");
    ASSERT_EQ(lines.size(), 1u) << r.out;
    double got_loss = 0, got_acc = 0;
    ASSERT_EQ(std::sscanf(lines[0].c_str(), "loss=%lf acc=%lf", &got_loss, &got_acc), 2)
        << lines[0];
    EXPECT_DOUBLE_EQ(got_loss, loss / weight);
    EXPECT_DOUBLE_EQ(got_acc, acc / weight);
  }
}

TEST(HelpersMetrics, DifferentKeysNameTheRankOnEveryRank) {
  auto r = run_workers(3, {kHelpers, "keys-mismatch"});
  expect_checks_pass(r, 3);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(rank_lines(r.out, rank, "ERROR "),
              std::vector<std::string>{
                  "average_metrics: metric keys differ across ranks: rank 1 has ['accuracy', "
                  "'loss'], rank 0 has ['acc', 'loss'] (rank 1 lacks ['acc']; rank 1 has extra "
                  "['accuracy'])"})
        << r.out;
  }
}

TEST(HelpersParams, ADifferentCountNamesTheRankWithTheExtraParameter) {
  auto r = run_workers(3, {kHelpers, "params-count"});
  expect_checks_pass(r, 3);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(rank_lines(r.out, rank, "ERROR "),
              std::vector<std::string>{
                  "check_same_params: rank 2 has 5 parameters, rank 0 has 4; first extra: "
                  "parameter 4 'fc3.weight' on rank 2"})
        << r.out;
  }
}

TEST(HelpersParams, BroadcastWithDifferentBuffersFailsEveryRankInsteadOfHanging) {
  auto r = run_workers(2, {kHelpers, "layout-mismatch"});
  ASSERT_TRUE(r.exited);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    auto lines = rank_lines(r.out, rank, "ERROR ");
    ASSERT_EQ(lines.size(), 1u) << r.out;
    EXPECT_TRUE(has(lines[0], "rank 1 has 99 float32, rank 0 has 100 float32")) << lines[0];
  }
}

TEST(CApi, FromACProgram) {
  auto r = run_workers(2, {kCWorker});
  ASSERT_TRUE(r.exited);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    std::string n = std::to_string(rank);
    EXPECT_EQ(rank_lines(r.out, rank, "C OK "), std::vector<std::string>{"rank=" + n}) << r.out;
    EXPECT_EQ(rank_lines(r.out, rank, "C rank="),
              std::vector<std::string>{n + " size=2 local=" + n})
        << r.out;
    auto bad = rank_lines(r.out, rank, "C bad dtype: ");
    ASSERT_EQ(bad.size(), 1u) << r.out;
    EXPECT_TRUE(has(bad[0], "ddp_all_reduce: dtype 42 is not a DDP_* dtype")) << bad[0];
  }
}

TEST(CApi, FromPythonThroughCtypes) {
  auto r = run_workers(2, {kPython, kCtypesScript, kLibddp}, {"--no_python"});
  ASSERT_TRUE(r.exited);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    std::string n = std::to_string(rank);
    EXPECT_EQ(rank_lines(r.out, rank, "PY OK "), std::vector<std::string>{"rank=" + n}) << r.out;
    auto bad = rank_lines(r.out, rank, "PY bad dtype: ");
    ASSERT_EQ(bad.size(), 1u) << r.out;
    EXPECT_TRUE(has(bad[0], "dtype 99")) << bad[0];
  }
}

}  // namespace
}  // namespace ddp::testing
