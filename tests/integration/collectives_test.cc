// libddp's collectives across real processes: ddprun starts collective_worker,
// whose ranks find each other through ddprun's gRPC rendezvous (ddp::init())
// and check every collective, dtype and op against values computed locally,
// on gloo and on the default backend (shm for several ranks on this node).

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "ddp/common/rendezvous_client.h"
#include "ddp/common/shm_names.h"
#include "run_ddprun.h"
#include "shm_segments.h"
#include "standalone_store.h"
#include "subprocess.h"
#include "unique_run_id.h"

namespace ddp::testing {
namespace {

using ::ddp::testing::shm_segments_of;
using ::ddp::testing::unique_run_id;

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

// The default backend instead: DDP_BACKEND unset ("auto"), with no GPU visible
// so that auto means shm for several ranks on this node (and gloo for one).
std::map<std::string, std::string> auto_env(std::map<std::string, std::string> extra = {}) {
  auto env = worker_env(std::move(extra));
  env["DDP_BACKEND"] = "\x01";
  env["CUDA_VISIBLE_DEVICES"] = "";
  return env;
}

ProcessResult run_workers(int nproc, std::vector<std::string> worker_args,
                          const std::map<std::string, std::string>& env,
                          std::chrono::milliseconds timeout = 60s,
                          std::vector<std::string> ddprun_args = {}) {
  std::vector<std::string> argv = {"--nproc_per_node=" + std::to_string(nproc)};
  argv.insert(argv.end(), ddprun_args.begin(), ddprun_args.end());
  argv.push_back(kWorker);
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return ddprun(argv, env, timeout);
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

// (nproc, backend): "gloo", or "auto" (the default: shm for several ranks).
class EveryCollective : public ::testing::TestWithParam<std::tuple<int, std::string>> {
 protected:
  int nproc() const { return std::get<0>(GetParam()); }
  bool automatic() const { return std::get<1>(GetParam()) == "auto"; }
  std::map<std::string, std::string> env() const { return automatic() ? auto_env() : worker_env(); }
  // What the worker reports: a world of one is always local.
  std::string backend() const { return nproc() == 1 ? "local" : automatic() ? "shm" : "gloo"; }
};

TEST_P(EveryCollective, AgreesWithLocalReferenceOnEveryRank) {
  const int n = nproc();
  const std::string run_id =
      unique_run_id("every" + std::get<1>(GetParam()) + std::to_string(n) + "x");
  auto r = run_workers(n, {"all"}, env(), 60s, {"--run_id=" + run_id});
  ASSERT_TRUE(r.exited) << "ddprun did not finish within 60 s\n" << r.out << r.err;
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_EQ(line_starting(r, rank, "COLLECTIVES"), "COLLECTIVES OK rank=" + std::to_string(rank) +
                                                         " world=" + std::to_string(n) +
                                                         " backend=" + backend())
        << r.out << r.err;
  }
  EXPECT_EQ(shm_segments_of(run_id), std::vector<std::string>{});
}

INSTANTIATE_TEST_SUITE_P(Workers, EveryCollective,
                         ::testing::Combine(::testing::Values(1, 2, 4),
                                            ::testing::Values("gloo", "auto")),
                         [](const ::testing::TestParamInfo<std::tuple<int, std::string>>& info) {
                           return "nproc" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param);
                         });

// all_reduces of up to 64 MiB: the worker's own control under gloo, and every
// path of shm (single-copy, chunked, zero-copy) across real processes.
class LargeAllReduce : public EveryCollective {};

TEST_P(LargeAllReduce, InPrivateAndAllocatedMemoryOnEveryRank) {
  const int n = nproc();
  const std::string run_id =
      unique_run_id("large" + std::get<1>(GetParam()) + std::to_string(n) + "x");
  auto r = run_workers(n, {"large"}, env(), 60s, {"--run_id=" + run_id});
  ASSERT_TRUE(r.exited) << "ddprun did not finish within 60 s\n" << r.out << r.err;
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_EQ(line_starting(r, rank, "LARGE"), "LARGE OK rank=" + std::to_string(rank) + " world=" +
                                                   std::to_string(n) + " backend=" + backend())
        << r.out << r.err;
  }
  EXPECT_EQ(shm_segments_of(run_id), std::vector<std::string>{});
}

INSTANTIATE_TEST_SUITE_P(Workers, LargeAllReduce,
                         ::testing::Combine(::testing::Values(3),
                                            ::testing::Values("gloo", "auto")),
                         [](const ::testing::TestParamInfo<std::tuple<int, std::string>>& info) {
                           return "nproc" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param);
                         });

// shm: a rank that dies (SIGKILL) is named by the others, which fail at once
// rather than at the timeout; ddprun reports it; nothing is left in /dev/shm.
TEST(CollectiveFailures, RankKilledMidAllReduceIsNamedByEverySurvivorLongBeforeTheTimeout) {
  const int n = 3;
  const std::string run_id = unique_run_id("kill");
  auto r = run_workers(n, {"kill"}, auto_env({{"DDP_TIMEOUT_S", "30"}}), 60s,
                       {"--run_id=" + run_id, "--shutdown_timeout=20"});
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_NE(r.code, 0) << r.out << r.err;
  // The survivors report within the 30 s timeout's first third (they exit on their own:
  // SIGTERM is ignored and ddprun's SIGKILL comes only after 20 s).
  EXPECT_LT(r.seconds, 10.0) << r.out << r.err;
  for (int rank : {0, 2}) {
    auto line = line_starting(r, rank, "EXPECTED ERROR");
    SCOPED_TRACE("rank " + std::to_string(rank) + ": " + line);
    EXPECT_NE(line.find("rank 1 (pid "), std::string::npos) << r.out << r.err;
    EXPECT_NE(line.find("same node) exited"), std::string::npos) << r.out << r.err;
    EXPECT_NE(line.find("all_reduce of 4194304 float32 (max)"), std::string::npos) << r.out;
    auto after = line_starting(r, rank, "FAILED AFTER ms=");
    ASSERT_NE(after, "") << r.out;
    EXPECT_LT(std::stol(after.substr(16)), 10000) << after;
  }
  EXPECT_EQ(line_starting(r, 1, "EXPECTED ERROR"), "") << r.out;
  EXPECT_NE(r.err.find("worker failed: rank 1 (local rank 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("SIGKILL"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("worker failed: rank 0"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("worker failed: rank 2"), std::string::npos) << r.err;
  EXPECT_EQ(shm_segments_of(run_id), std::vector<std::string>{});
}

// Every all-reduce variant (DDP_SHM_ALGO; auto: timed by the ranks) gives the
// right sums, bit-identical on every rank, for 2 and 3 ranks, sizes up to 16 MiB.
class ShmAlgorithm : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(ShmAlgorithm, InPlaceAllReducesAreRightOnEveryRank) {
  const auto& [algorithm, n] = GetParam();
  const std::string run_id = unique_run_id("algo" + algorithm + std::to_string(n) + "x");
  auto r = run_workers(n, {"large", "16"},
                       worker_env({{"DDP_BACKEND", "shm"}, {"DDP_SHM_ALGO", algorithm}}), 60s,
                       {"--run_id=" + run_id});
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_EQ(line_starting(r, rank, "LARGE"), "LARGE OK rank=" + std::to_string(rank) +
                                                   " world=" + std::to_string(n) + " backend=shm")
        << r.out << r.err;
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, ShmAlgorithm,
                         ::testing::Combine(::testing::Values("auto", "push", "pull", "chunked",
                                                              "small"),
                                            ::testing::Values(2, 3)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, int>>& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(ShmAlgorithms, RanksThatDisagreeOrAMalformedSettingAreErrorsNamingTheVariable) {
  // Local rank 1 alone asks for pull.
  auto r = run_process(
      {kDdprun, "--nproc_per_node=2", "sh", "-c",
       "if [ \"$LOCAL_RANK\" = 1 ]; then export DDP_SHM_ALGO=pull; fi; exec \"$0\" large 1",
       kWorker},
      worker_env({{"DDP_BACKEND", "shm"}}), 60s);
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("force different algorithms (DDP_SHM_ALGO): rank 0 auto, rank 1 pull"),
            std::string::npos)
      << r.out << r.err;
  // Local rank 1 alone sets a timing budget.
  auto budget = run_process(
      {kDdprun, "--nproc_per_node=2", "sh", "-c",
       "if [ \"$LOCAL_RANK\" = 1 ]; then export DDP_SHM_TUNE_BUDGET_MS=1; fi; exec \"$0\" large 1",
       kWorker},
      worker_env({{"DDP_BACKEND", "shm"}}), 60s);
  ASSERT_TRUE(budget.exited) << budget.out << budget.err;
  EXPECT_NE(budget.code, 0);
  EXPECT_NE(budget.err.find(
                "different timing budgets (DDP_SHM_TUNE_BUDGET_MS): rank 0 50 ms, rank 1 1 ms"),
            std::string::npos)
      << budget.out << budget.err;
  auto bad = run_workers(2, {"large", "1"},
                         worker_env({{"DDP_BACKEND", "shm"}, {"DDP_SHM_ALGO", "fastest"}}));
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(
      (bad.out + bad.err).find("DDP_SHM_ALGO='fastest' is not auto, push, pull, chunked, small"),
      std::string::npos)
      << bad.out << bad.err;
  // A tune file with a line that is not a choice: every rank fails naming it.
  const std::string file = std::filesystem::temp_directory_path() / unique_run_id("tunefile");
  std::ofstream(file) << "all_reduce 2 1048576 fastest\n";
  auto tune = run_workers(2, {"large", "1"},
                          worker_env({{"DDP_BACKEND", "shm"}, {"DDP_SHM_TUNE_FILE", file}}));
  std::filesystem::remove(file);
  EXPECT_NE(tune.code, 0);
  EXPECT_NE((tune.out + tune.err).find("shm tune file " + file + " line 1"), std::string::npos)
      << tune.out << tune.err;
  EXPECT_NE((tune.out + tune.err).find("all_reduce has no variant 'fastest'"), std::string::npos)
      << tune.out << tune.err;
}

// ddp::new_group: a second group over the job's ranks, with its own shm
// segment and variants, beside the default one; "default" is refused.
TEST(NewGroup, ASecondGroupRunsBesideTheDefaultOneWithItsOwnVariants) {
  for (const std::string backend : {"shm", "gloo"}) {
    SCOPED_TRACE(backend);
    auto r = run_workers(2, {"groups"}, worker_env({{"DDP_BACKEND", backend}}));
    ASSERT_TRUE(r.exited) << r.out << r.err;
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    for (int rank = 0; rank < 2; ++rank) {
      const std::string line = line_starting(r, rank, "GROUPS");
      if (backend == "shm") {
        EXPECT_NE(line.find("(timed) second=chunked (forced)"), std::string::npos) << r.out;
      } else {
        EXPECT_EQ(line, "GROUPS rank=" + std::to_string(rank) + " default= second=") << r.out;
      }
      EXPECT_NE(line_starting(r, rank, "REFUSED").find("name 'default' must be 1-64 letters"),
                std::string::npos)
          << r.out;
    }
  }
}

// Ranks started by hand (no ddprun to report the death), sharing a standalone
// `ddprun rendezvous` store, on gloo: the survivors name the dead rank in
// milliseconds (its process is gone), not after the 3 s window in which the
// others' failures are collected.
TEST(CollectiveFailures, WithoutDdprunADeadRankIsNamedInMilliseconds) {
  const std::string run_id = unique_run_id("bare");
  StandaloneStore store(kDdprun, run_id);
  ASSERT_FALSE(store.endpoint.empty()) << store.daemon.read_err();
  const std::string& endpoint = store.endpoint;
  const int n = 3;
  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int rank = 0; rank < n; ++rank) {
    auto env = worker_env({{"RANK", std::to_string(rank)},
                           {"WORLD_SIZE", std::to_string(n)},
                           {"DDP_RDZV_ENDPOINT", endpoint},
                           {"DDP_RUN_ID", run_id},
                           {"DDP_RDZV_TOKEN", "t"},
                           {"DDP_TIMEOUT_S", "30"}});
    ranks.push_back(std::make_unique<Subprocess>(std::vector<std::string>{kWorker, "kill"}, env));
  }
  for (int rank = 0; rank < n; ++rank) {
    auto r = ranks[rank]->wait(30s);
    ASSERT_TRUE(r.exited) << "rank " << rank;
    if (rank == 1) continue;  // it killed itself
    SCOPED_TRACE("rank " + std::to_string(rank) + ":\n" + r.out + r.err);
    EXPECT_EQ(r.code, 0);
    EXPECT_NE(r.out.find("ranks that had not arrived: "), std::string::npos);
    EXPECT_NE(r.out.find("1 (pid " + std::to_string(ranks[1]->pid()) + ", exited)"),
              std::string::npos);
    const auto at = r.out.find("FAILED AFTER ms=");
    ASSERT_NE(at, std::string::npos);
    EXPECT_LT(std::stol(r.out.substr(at + 16)), 1000) << "the death took long to name";
  }
}

// Without ddprun, the rank that creates the node's shared-memory segment is
// killed during setup, before the others attach: the one that attaches later
// fails at once naming it, and removes the segment (nothing else would).
TEST(CollectiveFailures, WithoutDdprunASegmentLeftByARankKilledDuringSetupIsRemoved) {
  const std::string run_id = unique_run_id("setup");
  StandaloneStore store(kDdprun, run_id);
  ASSERT_FALSE(store.endpoint.empty()) << store.daemon.read_err();
  const std::string& endpoint = store.endpoint;
  auto rank_env = [&](int rank) {
    return auto_env({{"RANK", std::to_string(rank)},
                     {"WORLD_SIZE", "2"},
                     {"DDP_RDZV_ENDPOINT", endpoint},
                     {"DDP_RUN_ID", run_id},
                     {"DDP_RDZV_TOKEN", "t"},
                     {"DDP_TIMEOUT_S", "30"}});
  };
  Subprocess creator({kWorker, "all"}, rank_env(0));  // waits for rank 1 to attach
  // Killed once it has made the segment (its name is published first).
  ASSERT_TRUE(wait_until([&] { return shm_segments_of(run_id).size() == 1; }, 20s))
      << creator.read_err();
  kill(creator.pid(), SIGKILL);
  creator.wait(5s);
  ASSERT_EQ(shm_segments_of(run_id).size(), 1u) << "the killed creator left its segment";
  Subprocess late({kWorker, "all"}, rank_env(1));
  auto r = late.wait(20s);
  ASSERT_TRUE(r.exited);
  EXPECT_NE(r.code, 0);
  EXPECT_LT(r.seconds, 10.0) << "named at once, not at the 30 s timeout";
  EXPECT_NE(r.err.find("rank 0"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited"), std::string::npos) << r.err;
  EXPECT_EQ(shm_segments_of(run_id), std::vector<std::string>{});
}

// Local rank 0 publishes the segment's name before it makes the segment; one
// that died in between (here: a dead pid announced by hand, with a segment of
// size 0 as creation would leave it after shm_open) is named by the rank
// attaching, which removes what it left.
TEST(CollectiveFailures,
     WithoutDdprunARankThatDiedWhileMakingTheSegmentIsNamedAndItsSegmentRemoved) {
  const std::string run_id = unique_run_id("making");
  StandaloneStore store(kDdprun, run_id);
  ASSERT_FALSE(store.endpoint.empty()) << store.daemon.read_err();
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, nullptr, 0);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  char ns[128] = {};
  ASSERT_GT(readlink("/proc/self/ns/pid", ns, sizeof ns - 1), 0);
  const std::string name = shm_segment_name(run_id, 0, "default", 0, dead, "dead0");
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0) << name;
  close(fd);
  RendezvousClient store_client(store.endpoint, run_id, "t");
  store_client.set("pg/" + run_id + "/round0/default/shm/node0",
                   boot + "/" + ns + " " + std::to_string(dead) + " " + name);
  ASSERT_EQ(shm_segments_of(run_id).size(), 1u);
  Subprocess late({kWorker, "all"}, auto_env({{"RANK", "1"},
                                              {"WORLD_SIZE", "2"},
                                              {"DDP_RDZV_ENDPOINT", store.endpoint},
                                              {"DDP_RUN_ID", run_id},
                                              {"DDP_RDZV_TOKEN", "t"},
                                              {"DDP_TIMEOUT_S", "30"}}));
  auto r = late.wait(20s);
  ASSERT_TRUE(r.exited);
  EXPECT_NE(r.code, 0);
  EXPECT_LT(r.seconds, 10.0) << "named at once, not at the 30 s timeout";
  EXPECT_NE(r.err.find("pid " + std::to_string(dead) + ") exited before it had made segment"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(shm_segments_of(run_id), std::vector<std::string>{});
}

TEST(CollectiveFailures, TimeoutNamesAllReduceItsSizeAndTheRankThatNeverCame) {
  const int n = 3;
  auto dir = make_temp_dir();
  auto r = run_workers(n, {"timeout", "sleep", dir}, worker_env({{"DDP_TIMEOUT_S", "2"}}), 30s);
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
  auto r = run_workers(2, {"timeout", "exit"}, worker_env({{"DDP_TIMEOUT_S", "2"}}), 30s);
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
    auto r =
        run_workers(n, {"mismatch", std::to_string(odd)}, worker_env({{"DDP_DEBUG", "1"}}), 30s);
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

TEST(CollectiveSettings, UnknownBackendIsAnErrorNamingTheVariable) {
  auto r = run_workers(2, {"all"}, worker_env({{"DDP_BACKEND", "shared"}}), 30s);
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_NE(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("DDP_BACKEND='shared' is not one of auto, shm, gloo, nccl, local"),
            std::string::npos)
      << r.out << r.err;
}

// A broken installation (no libddprun_rpc.so beside ddprun): a worker that
// needs the store fails at once naming the missing file, long before its
// 30 s connect timeout, and one that does not need it runs as usual.
TEST(CollectiveSettings, AMissingRpcPluginFailsStoreUsersAtOnceNamingIt) {
  const std::string missing = "/nonexistent/libddprun_rpc.so";
  const auto start = std::chrono::steady_clock::now();
  auto r = run_workers(2, {"all"}, worker_env({{"DDPRUN_RPC_PLUGIN", missing}}), 60s);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_NE(r.code, 0) << r.out << r.err;
  EXPECT_LT(took, 20s) << r.out << r.err;
  EXPECT_NE(r.err.find("ddprun could not start the workers' rendezvous server, which libddp needs: "
                       "the rendezvous plugin " +
                       missing + " is missing or unreadable"),
            std::string::npos)
      << r.out << r.err;
  auto plain = run_process({kDdprun, "--nproc_per_node=2", "/bin/sh", "-c", "echo ran"},
                           worker_env({{"DDPRUN_RPC_PLUGIN", missing}}), 30s);
  ASSERT_TRUE(plain.exited) << plain.out << plain.err;
  EXPECT_EQ(plain.code, 0) << plain.out << plain.err;
  EXPECT_NE(plain.out.find("[rank 1] ran"), std::string::npos) << plain.out;
}

}  // namespace
}  // namespace ddp::testing
