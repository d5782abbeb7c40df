// GradSync across real processes: ddprun starts grad_sync_worker, whose ranks
// meet through the gRPC rendezvous (ddp::init()) and average gradients over
// Gloo, through the C++ API and the C API.

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include "run_ddprun.h"
#include "shm_segments.h"
#include "subprocess.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
const std::string kWorker = GRAD_SYNC_WORKER_PATH;

ProcessResult run_workers(int nproc, const std::string& mode, const std::string& backend = "gloo",
                          const std::string& timeout_s = "30",
                          const std::vector<std::string>& launcher_args = {}) {
  std::vector<std::string> argv = {"--nproc_per_node=" + std::to_string(nproc)};
  argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
  argv.push_back(kWorker);
  argv.push_back(mode);
  return ddprun(argv,
                {{"DDP_BACKEND", backend},
                 {"DDP_DEBUG", "\x01"},
                 {"DDP_TIMEOUT_S", timeout_s},
                 {"DDP_GLOO_IFACE", "\x01"},
                 {"DDP_LOG_LEVEL", "\x01"}},
                90s);
}

std::string line_starting(const ProcessResult& r, int rank, const std::string& start) {
  for (const auto& line : lines_with_prefix(r.out, "[rank " + std::to_string(rank) + "] ")) {
    if (line.rfind(start, 0) == 0) return line;
  }
  return "";
}

class Workers : public ::testing::TestWithParam<int> {};

TEST_P(Workers, ShardedGradientsAverageToTheWholeBatchGradient) {
  const int n = GetParam();
  auto r = run_workers(n, "equiv");
  ASSERT_TRUE(r.exited) << "ddprun did not finish within 90 s\n" << r.out << r.err;
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_EQ(line_starting(r, rank, "GRADSYNC"),
              "GRADSYNC OK rank=" + std::to_string(rank) + " world=" + std::to_string(n))
        << r.out << r.err;
  }
}

INSTANTIATE_TEST_SUITE_P(GradSync, Workers, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "nproc" + std::to_string(info.param);
                         });

TEST(GradSyncProcesses, CApiAveragesAndAccumulatesAcrossRanks) {
  auto r = run_workers(2, "capi");
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(line_starting(r, rank, "GRADSYNC"), "GRADSYNC CAPI OK rank=" + std::to_string(rank))
        << r.out << r.err;
  }
}

TEST(GradSyncProcesses, AParameterOneRankNeverMarksFailsEveryRankPromptly) {
  auto r = run_workers(2, "unused");
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_LT(r.seconds, 20.0) << "no rank may wait for a collective that never comes";
  auto owner = line_starting(r, 1, "EXPECTED ERROR");
  EXPECT_NE(owner.find("never marked ready on rank 1: 'fc2.bias' (index 3)"), std::string::npos)
      << r.out;
  auto other = line_starting(r, 0, "EXPECTED ERROR");
  EXPECT_NE(other.find("another rank had parameters that were never marked ready"),
            std::string::npos)
      << r.out;
}

// CommMode::kShared across processes (shm): the mean of every hand-over path,
// an accumulation window, prepare() from rank 0.
class SharedWorkers : public ::testing::TestWithParam<int> {};

TEST_P(SharedWorkers, ShardedGradientsSumToTheWholeBatchGradientInTheSharedSum) {
  const int n = GetParam();
  auto r = run_workers(n, "shared", n == 1 ? "gloo" : "shm");
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_EQ(line_starting(r, rank, "GRADSYNC"),
              "GRADSYNC SHARED OK rank=" + std::to_string(rank) + " world=" + std::to_string(n))
        << r.out << r.err;
  }
}

INSTANTIATE_TEST_SUITE_P(GradSync, SharedWorkers, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "nproc" + std::to_string(info.param);
                         });

TEST(GradSyncProcesses, CApiContributesToTheSharedSum) {
  auto r = run_workers(2, "capi_shared", "shm");
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_LT(r.seconds, 20.0) << "a failed writer must not leave the other rank waiting";
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(line_starting(r, rank, "GRADSYNC"),
              "GRADSYNC CAPI SHARED OK rank=" + std::to_string(rank))
        << r.out << r.err;
  }
}

// The C API's sharded parameters (ZeRO stage 1): one node-wide copy over shm,
// one per rank over Gloo; every element updated by exactly one rank.
TEST(GradSyncProcesses, CApiShardsTheParametersAmongTheRanks) {
  for (const auto& [backend, n, node_shared] : std::vector<std::tuple<std::string, int, int>>{
           {"shm", 2, 1}, {"gloo", 3, 0}, {"shm", 3, 1}}) {
    SCOPED_TRACE(backend + ", " + std::to_string(n) + " ranks");
    auto r = run_workers(n, "capi_shards", backend);
    ASSERT_TRUE(r.exited) << r.out << r.err;
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    for (int rank = 0; rank < n; ++rank) {
      EXPECT_EQ(line_starting(r, rank, "SHARDS"), "SHARDS CAPI OK rank=" + std::to_string(rank) +
                                                      " node_shared=" + std::to_string(node_shared))
          << r.out << r.err;
    }
  }
}

// A rank killed while it holds a block: the survivor names it long before the
// 30 s timeout (it watches the holder's process), ddprun reports the killed
// rank, nothing is left in /dev/shm.
TEST(GradSyncProcesses, ARankKilledInsideTheSharedSumIsNamedAndNothingIsLeftBehind) {
  const std::string run_id = "sharedkill" + std::to_string(getpid());
  auto r =
      run_workers(2, "shared_kill", "shm", "30", {"--run_id=" + run_id, "--shutdown_timeout=20"});
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_NE(r.code, 0) << r.out << r.err;
  EXPECT_LT(r.seconds, 10.0) << r.out << r.err;
  const auto line = line_starting(r, 0, "EXPECTED ERROR");
  EXPECT_NE(line.find("rank 1 (pid "), std::string::npos) << r.out << r.err;
  EXPECT_NE(line.find("same node) exited while it held rows [0, "), std::string::npos)
      << r.out << r.err;
  EXPECT_NE(r.err.find("worker failed: rank 1 (local rank 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("SIGKILL"), std::string::npos) << r.err;
  EXPECT_EQ(shm_segments_of(run_id), std::vector<std::string>{});
}

}  // namespace
}  // namespace ddp::testing
