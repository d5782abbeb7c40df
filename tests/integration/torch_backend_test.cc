// The c10d backend "ddp" (python/: ddprun.torch and its extension) in real
// torch 2.x programs: every collective against torch's own arithmetic, under
// ddprun and torchrun, found by its entry point or imported; the pip install;
// torch's own suite (a subset); the calls it refuses; the live view
// (--hang_timeout names the rank that never entered a collective); and
// Debian's torch 1.13 refused by name. The example programs on "ddp" against
// Gloo are in torch_ecosystem_test.cc.

#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "debian_torch.h"
#include "run_ddprun.h"
#include "subprocess.h"
#include "torch_env.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
const std::string kDdprun = DDPRUN_PATH;
const std::string kPackageDir = DDP_TORCH_PACKAGE_DIR;  // build/python
const std::string kScripts = TORCH_BACKEND_SCRIPTS;     // tests/torch
const std::string kTrainScript = TORCH_TRAIN_SCRIPT;

std::set<std::string> shm_entries() {
  std::set<std::string> names;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* entry = readdir(dir)) {
      std::string name = entry->d_name;
      if (name.rfind("ddp-", 0) == 0) names.insert(name);
    }
    closedir(dir);
  }
  return names;
}

// Runs `args` under ddprun with the build tree's package on the torch 2.x
// interpreter; checks nothing of libddp is left in /dev/shm afterwards.
ProcessResult ddprun_torch(std::vector<std::string> args,
                           std::map<std::string, std::string> env = {},
                           std::chrono::seconds timeout = 150s) {
  const auto before = shm_entries();
  env["DDP_PYTHON"] = torch2_python();
  env["PYTHONPATH"] = kPackageDir;
  auto r = ddprun(args, env, timeout);
  for (const auto& name : shm_entries()) {
    EXPECT_TRUE(before.count(name)) << "left in /dev/shm: " << name;
  }
  return r;
}

// `launcher_prefixes`: ddprun's "[rank R] " before each line (torchrun adds none).
void expect_every_rank_checked(const ProcessResult& r, int ranks, bool launcher_prefixes) {
  ASSERT_TRUE(r.exited) << "did not finish in time\n" << r.out << r.err;
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (int rank = 0; rank < ranks; ++rank) {
    const std::string prefix = launcher_prefixes ? "[rank " + std::to_string(rank) + "] " : "";
    auto lines = lines_with_prefix(r.out, prefix + "COLLECTIVES OK rank=" + std::to_string(rank));
    ASSERT_EQ(lines.size(), 1u) << r.out << r.err;
    // A run where most checks were skipped proves nothing: hundreds ran.
    auto checks = std::stoi(lines[0].substr(lines[0].find("checks=") + 7));
    EXPECT_GT(checks, 250) << lines[0];
    EXPECT_NE(lines[0].find("transport=shm"), std::string::npos) << lines[0];
  }
}

#define SKIP_WITHOUT_TORCH2() \
  if (auto reason = torch2_unavailable_reason(); !reason.empty()) GTEST_SKIP() << reason

TEST(TorchBackend, EveryCollectiveMatchesTorchOnTwoRanksFoundByItsEntryPoint) {
  SKIP_WITHOUT_TORCH2();
  // No `import ddprun.torch`: torch loads the backend through the
  // torch.distributed.backends entry point of the package's dist-info.
  auto r = ddprun_torch({"--nproc_per_node=2", kScripts + "/backend_collectives.py"},
                        {{"DDP_TORCH_IMPORT", "0"}});
  expect_every_rank_checked(r, 2, true);
}

TEST(TorchBackend, EveryCollectiveMatchesTorchOnThreeRanksThroughATcpStore) {
  SKIP_WITHOUT_TORCH2();
  const int port = free_port();
  ASSERT_GT(port, 0);
  auto r = ddprun_torch({"--nproc_per_node=3", kScripts + "/backend_collectives.py", "--init",
                         "tcp://127.0.0.1:" + std::to_string(port)});
  expect_every_rank_checked(r, 3, true);
}

TEST(TorchBackend, UnderTorchrunWithAFileStoreToo) {
  SKIP_WITHOUT_TORCH2();
  const auto before = shm_entries();
  const std::string dir = make_temp_dir();
  const std::string torchrun = torch2_python().substr(0, torch2_python().rfind('/')) + "/torchrun";
  auto r = run_process({torchrun, "--nproc_per_node=2", kScripts + "/backend_collectives.py",
                        "--init", "file://" + dir + "/store"},
                       {{"PYTHONPATH", kPackageDir}, {"OMP_NUM_THREADS", "1"}}, 150s);
  expect_every_rank_checked(r, 2, false);
  for (const auto& name : shm_entries()) EXPECT_TRUE(before.count(name)) << "left: " << name;
}

TEST(TorchBackend, RefusedCallsRaiseNamingWhatIsWrongAndTheGroupGoesOn) {
  SKIP_WITHOUT_TORCH2();
  auto r = ddprun_torch({"--nproc_per_node=2", kScripts + "/backend_bad_input.py"});
  ASSERT_TRUE(r.exited) << r.out << r.err;
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(lines_with_prefix(r.out, "[rank 1] BAD INPUT OK rank=1 cases=5").size(), 1u) << r.out;
}

TEST(TorchBackend, AWorldSizeOtherThanTheLaunchersIsNamed) {
  SKIP_WITHOUT_TORCH2();
  auto r = ddprun_torch(
      {"--nproc_per_node=2", kScripts + "/backend_bad_input.py", "--case", "world-size"});
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE((r.out + r.err)
                .find("ValueError: backend ddp: init_process_group was given world_size=3, but "
                      "the launcher started this process with WORLD_SIZE=2"),
            std::string::npos)
      << r.out << r.err;
}

TEST(TorchBackend, ASubgroupPeerThatNeverArrivesIsNamedAfterTheTimeout) {
  SKIP_WITHOUT_TORCH2();
  auto r = ddprun_torch(
      {"--nproc_per_node=2", kScripts + "/backend_bad_input.py", "--case", "late-peer"});
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find("rank(s) 1 did not arrive within 3 s"), std::string::npos)
      << r.out << r.err;
  EXPECT_LT(r.seconds, 60) << "the subgroup's 3 s timeout bounds the wait";
}

// `ddprun status` shows a torch rank on "ddp" as a libddp one: its
// collectives, and its steps (each optimizer.step()) with their time.
TEST(TorchBackend, StatusShowsATorchRanksCollectivesAndOptimizerSteps) {
  SKIP_WITHOUT_TORCH2();
  const std::string runtime = make_temp_dir();
  std::map<std::string, std::string> env = {
      {"XDG_RUNTIME_DIR", runtime}, {"DDP_PYTHON", torch2_python()}, {"PYTHONPATH", kPackageDir}};
  Subprocess job(
      {kDdprun, "--nproc_per_node=2", kTrainScript, "--epochs", "100000", "--backend", "ddp"}, env);
  ProcessResult r;
  std::smatch m;
  const bool shown = wait_until(
      [&] {
        r = run_process({kDdprun, "status", "--json"}, {{"XDG_RUNTIME_DIR", runtime}}, 10s);
        return std::regex_search(r.out, m,
                                 std::regex("\"rank\":1,[^}]*\"steps\":([1-9][0-9]*),"
                                            "\"step_median_s\":([0-9.]+)")) &&
               std::stod(m[2]) > 0;
      },
      60s);
  EXPECT_TRUE(shown) << r.out << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("\"collectives_done\":[1-9]"))) << r.out;
  kill(job.pid(), SIGTERM);
  EXPECT_TRUE(job.wait(60s).exited);
}

// ddprun's progress board sees a torch program's collectives on "ddp" as a
// libddp program's: --hang_timeout blames the rank that never entered
// all_reduce #4 and names the rank waiting for it there.
TEST(TorchBackend, HangTimeoutNamesTheRankThatNeverEnteredTheCollective) {
  SKIP_WITHOUT_TORCH2();
  auto r = ddprun_torch({"--nproc_per_node=2", "--hang_timeout=2", kScripts + "/backend_hang.py"});
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_EQ(r.code, 124) << r.err;
  EXPECT_NE(r.err.find("worker group hung (no progress for 2 s, --hang_timeout): rank 1 "),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("between collectives (3 done); rank 0 waits for it in all_reduce #4"),
            std::string::npos)
      << r.err;
}

// torch's own distributed suite (shipped in the wheel), a subset CI can
// afford: collectives, point-to-point, object collectives and DDP. Each of
// these passes on Gloo too (tests/torch/dist_suite.py runs the whole suite
// on both).
TEST(TorchBackend, TorchsOwnSuiteSubsetPasses) {
  SKIP_WITHOUT_TORCH2();
  if (auto reason = torch2_unavailable_reason("expecttest"); !reason.empty())
    GTEST_SKIP() << reason;
  const std::string tests =
      "test_all_reduce_sum,test_all_reduce_sum_async,test_reduce_sum,test_broadcast,"
      "test_all_gather,test_gather,test_scatter,test_send_recv_with_tag,test_isend,test_irecv,"
      "test_barrier,test_all_gather_object_default_pg,test_DistributedDataParallelCPU";
  auto r = run_process(
      {torch2_python(), kScripts + "/dist_suite.py", "--backend", "ddp", "--tests", tests},
      {{"PYTHONPATH", kPackageDir}, {"OMP_NUM_THREADS", "1"}}, 400s);
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("SUITE ddp world_size=3: run 13 passed 13 failed 0 skipped 0"),
            std::string::npos)
      << r.out << r.err;
}

// What `pip install --no-build-isolation .` put into the torch environment
// (scripts/install-torch-env.sh runs it): the environment's own ddprun runs
// a program on "ddp" with nothing on PYTHONPATH; torch finds the backend by
// the installed package's entry point.
TEST(TorchBackend, ThePipInstalledPackageRunsUnderItsOwnDdprun) {
  SKIP_WITHOUT_TORCH2();
  const std::string installed = torch2_python().substr(0, torch2_python().rfind('/')) + "/ddprun";
  if (access(installed.c_str(), X_OK) != 0) {
    GTEST_SKIP() << "no " << installed << ": scripts/install-torch-env.sh installs the package";
  }
  auto r = run_process(
      {installed, "--nproc_per_node=2", kTrainScript, "--epochs", "1", "--backend", "ddp"},
      {{"DDP_PYTHON", torch2_python()}, {"PYTHONPATH", "\x01"}}, 150s);
  ASSERT_TRUE(r.exited) << r.out << r.err;
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  auto rank0 = lines_with_prefix(r.out, "[rank 0] FINAL_WEIGHTS");
  auto rank1 = lines_with_prefix(r.out, "[rank 1] FINAL_WEIGHTS");
  ASSERT_EQ(rank0.size(), 1u) << r.out;
  ASSERT_EQ(rank1.size(), 1u) << r.out;
  EXPECT_EQ(rank0[0].substr(rank0[0].find(" sum=")), rank1[0].substr(rank1[0].find(" sum=")));
}

TEST(TorchBackend, DebianTorch113IsRefusedNamingItsVersion) {
  if (auto reason = torch_unavailable_reason(); !reason.empty()) GTEST_SKIP() << reason;
  auto r =
      run_process({kDebianPython, "-c", "import ddprun.torch"}, {{"PYTHONPATH", kPackageDir}}, 60s);
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("ImportError: ddprun.torch needs torch 2.0 or newer; this interpreter has "
                       "torch 1.13"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace ddp::testing
