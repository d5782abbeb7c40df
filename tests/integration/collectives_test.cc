// libddp's collectives across real processes: ddprun starts collective_worker,
// whose ranks find each other through ddprun's gRPC rendezvous (ddp::init())
// and check every collective, dtype and op against values computed locally.

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "subprocess.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
const std::string kDdprun = DDPRUN_PATH;
const std::string kWorker = COLLECTIVE_WORKER_PATH;

// Gloo on every machine (a visible GPU would otherwise pick NCCL), and none of
// the knobs a developer's shell may carry.
std::map<std::string, std::string> worker_env(std::map<std::string, std::string> extra = {}) {
  std::map<std::string, std::string> env = {{"DDP_BACKEND", "gloo"},
                                            {"DDP_DEBUG", "\x01"},
                                            {"DDP_TIMEOUT_S", "60"},
                                            {"DDP_GLOO_IFACE", "\x01"}};
  for (auto& [k, v] : extra) env[k] = v;
  return env;
}

ProcessResult ddprun(int nproc, std::vector<std::string> worker_args,
                     const std::map<std::string, std::string>& env,
                     std::chrono::milliseconds timeout = 60s) {
  std::vector<std::string> argv = {kDdprun, "--nproc_per_node=" + std::to_string(nproc), kWorker};
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return run_process(argv, env, timeout);
}

// What rank `rank` printed (ddprun prefixes each line with "[rank R] ").
std::vector<std::string> lines_of(const ProcessResult& r, int rank) {
  return lines_with_prefix(r.out, "[rank " + std::to_string(rank) + "] ");
}

// The line of `rank` that starts with `start`, or "" when it printed none.
std::string line_starting(const ProcessResult& r, int rank, const std::string& start) {
  for (const auto& line : lines_of(r, rank)) {
    if (line.rfind(start, 0) == 0) return line;
  }
  return "";
}

class EveryCollective : public ::testing::TestWithParam<int> {};

TEST_P(EveryCollective, AgreesWithLocalReferenceOnEveryRank) {
  const int n = GetParam();
  auto r = ddprun(n, {"all"}, worker_env());
  ASSERT_TRUE(r.exited) << "ddprun did not finish within 60 s\n" << r.out << r.err;
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  const std::string backend = n == 1 ? "local" : "gloo";
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_EQ(line_starting(r, rank, "COLLECTIVES"), "COLLECTIVES OK rank=" + std::to_string(rank) +
                                                         " world=" + std::to_string(n) +
                                                         " backend=" + backend)
        << r.out << r.err;
  }
}

INSTANTIATE_TEST_SUITE_P(Workers, EveryCollective, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "nproc" + std::to_string(info.param);
                         });

TEST(CollectiveFailures, TimeoutNamesAllReduceItsSizeAndTheRankThatNeverCame) {
  const int n = 3;
  auto dir = make_temp_dir();
  auto r = ddprun(n, {"timeout", "sleep", dir}, worker_env({{"DDP_TIMEOUT_S", "2"}}), 30s);
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  // 2 s collective timeout, at most 2 s asking who arrived, plus start-up.
  EXPECT_LT(r.seconds, 15.0);
  for (int rank : {0, 2}) {
    auto line = line_starting(r, rank, "EXPECTED ERROR");
    SCOPED_TRACE("rank " + std::to_string(rank) + ": " + line);
    EXPECT_NE(line.find("all_reduce of 12 float32 (sum)"), std::string::npos) << r.out;
    EXPECT_NE(line.find("ranks that had not arrived: 1"), std::string::npos) << r.out;
  }
  EXPECT_EQ(line_starting(r, 1, "EXPECTED ERROR"), "");
}

TEST(CollectiveFailures, PeerThatLeftIsNamedAsNotArrived) {
  auto r = ddprun(2, {"timeout", "exit"}, worker_env({{"DDP_TIMEOUT_S", "2"}}), 30s);
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_LT(r.seconds, 15.0);
  auto line = line_starting(r, 0, "EXPECTED ERROR");
  EXPECT_NE(line.find("all_reduce of 12 float32 (sum)"), std::string::npos) << r.out << r.err;
  EXPECT_NE(line.find("ranks that had not arrived: 1"), std::string::npos) << r.out << r.err;
}

TEST(CollectiveFailures, DebugMismatchNamesTheDifferingRankOnEveryRank) {
  const int n = 3;
  for (int odd : {1, 0}) {
    SCOPED_TRACE("differing rank " + std::to_string(odd));
    auto r = ddprun(n, {"mismatch", std::to_string(odd)}, worker_env({{"DDP_DEBUG", "1"}}), 30s);
    ASSERT_TRUE(r.exited) << r.out << r.err;
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_LT(r.seconds, 15.0) << "a mismatch must be reported at once, not after the timeout";
    for (int rank = 0; rank < n; ++rank) {
      auto line = line_starting(r, rank, "EXPECTED ERROR");
      SCOPED_TRACE("rank " + std::to_string(rank) + ": " + line);
      EXPECT_NE(line.find("mismatch"), std::string::npos) << r.out;
      EXPECT_NE(line.find("rank(s) " + std::to_string(odd) + " differ"), std::string::npos)
          << r.out;
      EXPECT_NE(line.find("rank " + std::to_string(odd) + " has count 5"), std::string::npos)
          << r.out;
      EXPECT_EQ(line_starting(r, rank, "MISMATCH OK"), "MISMATCH OK rank=" + std::to_string(rank))
          << r.out;
    }
  }
}

TEST(WorldOfOne, WorkerWithoutDdprunRunsEveryCollectiveLocally) {
  auto env = worker_env();
  for (const char* name :
       {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
        "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DDP_RDZV_ENDPOINT",
        "DDP_RUN_ID", "DDP_RDZV_TOKEN", "DDP_ROUND", "TORCHELASTIC_RUN_ID"}) {
    env[name] = "\x01";
  }
  auto r = run_process({kWorker, "single"}, env, 30s);
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("COLLECTIVES OK rank=0 world=1 backend=local\n"), std::string::npos)
      << r.out << r.err;
}

TEST(WorldOfOne, UnknownModeShowsUsage) {
  auto r = run_process({kWorker, "nonsense"}, worker_env(), 10s);
  EXPECT_EQ(r.code, 64);
  EXPECT_NE(r.err.find("usage: collective_worker"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ddp::testing
