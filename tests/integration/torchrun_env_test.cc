// What workers and schedulers get from ddprun as they would from torchrun
// 2.x: torchrun's own variables (an inherited copy never passed on), error
// files and the root cause for the launcher's TORCHELASTIC_ERROR_FILE,
// torchrun's log layout, --virtual_local_rank, the 30 s shutdown grace and
// TORCH_ELASTIC_SHUTDOWN_TIMEOUT, PYTHON_EXEC and Python programs without .py.

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <regex>

#include "launcher_harness.h"
#include "subprocess.h"
#include "torch_env.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
using namespace launcher_test;
const std::string kRecordFailure = RECORD_FAILURE_PY;

TEST(TorchrunEnv, InheritedTorchrunVariablesAreReplacedAsTorchrunSetsThem) {
  // As from inside a torchrun job's worker: these must not reach our workers.
  auto r = ddprun({"--nproc_per_node=2", kWorker, "env"},
                  {{"TORCHELASTIC_USE_AGENT_STORE", "True"},
                   {"TORCHELASTIC_ERROR_FILE", "/nonexistent/outer/error.json"},
                   {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "\x01"}});
  ASSERT_EQ(r.code, 0) << r.err;
  auto envs = env_by_rank(r.out);
  ASSERT_EQ(envs.size(), 2u) << r.out;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(envs[rank]["TORCHELASTIC_USE_AGENT_STORE"], "False") << "rank " << rank;
    EXPECT_EQ(envs[rank]["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1") << "rank " << rank;
    const std::string file = envs[rank]["TORCHELASTIC_ERROR_FILE"];
    EXPECT_NE(file.find("/attempt_0/" + std::to_string(rank) + "/error.json"), std::string::npos)
        << file;
  }
  EXPECT_NE(envs[0]["TORCHELASTIC_ERROR_FILE"], envs[1]["TORCHELASTIC_ERROR_FILE"]);
  auto kept =
      ddprun({"--nproc_per_node=1", kWorker, "env"}, {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"}});
  EXPECT_EQ(env_by_rank(kept.out)[0]["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "3") << kept.out;
}

TEST(TorchrunEnv, LogDirHasTorchrunsLayoutAndRunsNeverOverwriteEachOther) {
  const std::string dir = make_temp_dir();
  std::vector<std::string> roots;
  for (int run = 0; run < 2; ++run) {
    auto r = ddprun({"--nnodes=1", "--nproc_per_node=2", "--run_id=none", "--log_dir=" + dir, "sh",
                     "-c", "echo out$LOCAL_RANK"});
    ASSERT_EQ(r.code, 0) << r.err;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.err, m, std::regex("worker logs go to (\\S+)"))) << r.err;
    roots.push_back(m[1]);
    EXPECT_EQ(read_file(roots.back() + "/attempt_0/1/stdout.log"), "out1\n");
  }
  EXPECT_NE(roots[0], roots[1]);
  for (const auto& root : roots) {
    EXPECT_TRUE(std::regex_match(root, std::regex(dir + "/none_[A-Za-z0-9]{8}"))) << root;
    EXPECT_EQ(read_file(root + "/attempt_0/0/stdout.log"), "out0\n")
        << "the first run's log was overwritten";
  }
  std::filesystem::remove_all(dir);
}

TEST(TorchrunEnv, VirtualLocalRankGivesEachWorkerLocalRankZeroAndItsOwnDevice) {
  auto r = ddprun({"--nproc_per_node=2", "--virtual-local-rank", "sh", "-c",
                   "echo LR=$LOCAL_RANK RANK=$RANK CVD=$CUDA_VISIBLE_DEVICES"},
                  {{"CUDA_VISIBLE_DEVICES", "4,6"}});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("[rank 0] LR=0 RANK=0 CVD=4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 1] LR=0 RANK=1 CVD=6"), std::string::npos) << r.out;
  auto plain = ddprun(
      {"--nproc_per_node=2", "--virtual-local-rank", "sh", "-c", "echo CVD=$CUDA_VISIBLE_DEVICES"},
      {{"CUDA_VISIBLE_DEVICES", "\x01"}});
  EXPECT_NE(plain.out.find("[rank 1] CVD=1"), std::string::npos) << plain.out;
  auto short_list = ddprun({"--nproc_per_node=3", "--virtual-local-rank", "true"},
                           {{"CUDA_VISIBLE_DEVICES", "4,6"}});
  EXPECT_NE(short_list.code, 0);
  EXPECT_NE(short_list.err.find("local rank 2 has no device in CUDA_VISIBLE_DEVICES=4,6"),
            std::string::npos)
      << short_list.err;
}

// The devices a worker sees when the launcher chooses them: a Slurm step's
// GPUs (ddprun's own environment names none), and with --virtual-local-rank
// one of those, or one of HIP_VISIBLE_DEVICES' when it is set.
TEST(TorchrunEnv, TheSlurmStepsGpusAndAVirtualLocalRanksDeviceReachTheWorkers) {
  const std::map<std::string, std::string> one_node_step = {{"SLURM_JOB_ID", "77"},
                                                            {"SLURM_STEP_ID", "0"},
                                                            {"SLURM_STEP_NUM_NODES", "1"},
                                                            {"SLURM_NODEID", "0"},
                                                            {"SLURM_STEP_NODELIST", "localhost"},
                                                            {"SLURM_STEP_GPUS", "2,3"},
                                                            {"CUDA_VISIBLE_DEVICES", "\x01"},
                                                            {"HIP_VISIBLE_DEVICES", "\x01"}};
  const std::string show = "echo CVD=$CUDA_VISIBLE_DEVICES HIP=$HIP_VISIBLE_DEVICES";
  auto step = ddprun({"--nproc_per_node=2", "sh", "-c", show}, one_node_step);
  ASSERT_EQ(step.code, 0) << step.err;
  EXPECT_NE(step.out.find("[rank 0] CVD=2,3 HIP="), std::string::npos) << step.out;
  EXPECT_NE(step.out.find("[rank 1] CVD=2,3 HIP="), std::string::npos) << step.out;
  auto own =
      ddprun({"--nproc_per_node=2", "--virtual-local-rank", "sh", "-c", show}, one_node_step);
  ASSERT_EQ(own.code, 0) << own.err;
  EXPECT_NE(own.out.find("[rank 0] CVD=2 HIP="), std::string::npos) << own.out;
  EXPECT_NE(own.out.find("[rank 1] CVD=3 HIP="), std::string::npos) << own.out;
  auto hip = ddprun({"--nproc_per_node=2", "--virtual-local-rank", "sh", "-c", show},
                    {{"CUDA_VISIBLE_DEVICES", "4,6"}, {"HIP_VISIBLE_DEVICES", "5,7"}});
  ASSERT_EQ(hip.code, 0) << hip.err;
  EXPECT_NE(hip.out.find("[rank 1] CVD=7 HIP=7"), std::string::npos) << hip.out;
}

TEST(TorchrunEnv, RecordsErrorFileReachesTheLaunchersErrorFileWithItsExitCode) {
  if (auto reason = torch2_unavailable_reason(); !reason.empty()) GTEST_SKIP() << reason;
  const std::string dir = make_temp_dir();
  const std::string root_cause = dir + "/root.json";
  auto r =
      ddprun({"--nproc_per_node=2", "--run_id=rec", "--log_dir=" + dir + "/logs", kRecordFailure},
             {{"DDP_PYTHON", torch2_python()}, {"TORCHELASTIC_ERROR_FILE", root_cause}}, 120s);
  ASSERT_TRUE(r.exited) << r.err;
  EXPECT_EQ(r.code, 1) << r.err;
  const std::string child = read_file(run_dir(dir + "/logs", "rec") + "/attempt_0/1/error.json");
  EXPECT_NE(child.find("ValueError: deliberate failure on rank 1"), std::string::npos) << child;
  const std::string data = read_file(root_cause);
  EXPECT_EQ(data.rfind("{\"message\": {\"errorCode\": 1, ", 0), 0u) << data;
  EXPECT_NE(data.find("ValueError: deliberate failure on rank 1"), std::string::npos) << data;
  EXPECT_NE(data.find("py_callstack"), std::string::npos) << data;
  std::filesystem::remove_all(dir);
}

TEST(TorchrunEnv, WithoutAnErrorFileTheRootCauseIsDdprunsReportAndTheTemporaryFilesGo) {
  const std::string dir = make_temp_dir();
  const std::string root_cause = dir + "/root.json";
  auto r = ddprun(
      {"--nproc_per_node=2", "--run_id=plain", "sh", "-c", "[ $RANK = 1 ] && exit 3; sleep 30"},
      {{"TORCHELASTIC_ERROR_FILE", root_cause}, {"TMPDIR", dir}});
  EXPECT_EQ(r.code, 3) << r.err;
  const std::string data = read_file(root_cause);
  EXPECT_EQ(
      data.rfind(
          "{\"message\": {\"errorCode\": 3, \"message\": \"ChildFailedError: rank 1 exit code 3\"",
          0),
      0u)
      << data;
  EXPECT_NE(data.find("\"timestamp\": \""), std::string::npos) << data;
  // The private directory of the workers' error files is gone with ddprun.
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().filename().string().rfind("ddprun-plain-", 0), std::string::npos)
        << entry.path();
  }
  std::filesystem::remove_all(dir);
}

// A worker whose SIGTERM handler takes 6 s to save a checkpoint (as
// Lightning's and Megatron's do on preemption).
const char* kSlowCheckpoint =
    "trap 'sleep 6; echo saved > $CKPT_DIR/ckpt_$RANK; exit 0' TERM; echo ready > "
    "$CKPT_DIR/ready_$RANK; "
    "while :; do sleep 0.1; done";

TEST(TorchrunEnv, ASigtermHandlerHasTorchrunsThirtySecondsToSaveACheckpoint) {
  const std::string dir = make_temp_dir();
  Subprocess p({kDdprun, "--nproc_per_node=2", "sh", "-c", kSlowCheckpoint}, {{"CKPT_DIR", dir}});
  ASSERT_TRUE(wait_until(
      [&] {
        return std::filesystem::exists(dir + "/ready_0") &&
               std::filesystem::exists(dir + "/ready_1");
      },
      20s));
  kill(p.pid(), SIGTERM);
  auto r = p.wait(40s);
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(read_file(dir + "/ckpt_0"), "saved\n") << "rank 0 was killed mid-save\n" << r.err;
  EXPECT_EQ(read_file(dir + "/ckpt_1"), "saved\n") << "rank 1 was killed mid-save\n" << r.err;
  std::filesystem::remove_all(dir);
}

TEST(TorchrunEnv, TorchElasticShutdownTimeoutSetsTheGrace) {
  const std::string dir = make_temp_dir();
  Subprocess p({kDdprun, "--nproc_per_node=1", "sh", "-c", kSlowCheckpoint},
               {{"CKPT_DIR", dir}, {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "1"}});
  ASSERT_TRUE(wait_until([&] { return std::filesystem::exists(dir + "/ready_0"); }, 20s));
  kill(p.pid(), SIGTERM);
  auto r = p.wait(20s);
  ASSERT_TRUE(r.exited);
  EXPECT_LT(r.seconds, 5.5) << "the 1 s grace was not used";
  EXPECT_FALSE(std::filesystem::exists(dir + "/ckpt_0")) << "the worker outlived a 1 s grace";
  std::filesystem::remove_all(dir);
}

TEST(TorchrunEnv, PythonExecRunsAnExtensionlessScript) {
  const std::string dir = make_temp_dir();
  write_file(dir + "/train",
             "import sys\nprint('PY', sys.executable)\n");  // no .py, no #!, not executable
  auto r = ddprun({"--nproc_per_node=1", dir + "/train"},
                  {{"PYTHON_EXEC", "/usr/bin/python3"}, {"DDP_PYTHON", "\x01"}});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("[rank 0] PY /usr/bin/python3"), std::string::npos) << r.out << r.err;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ddp::testing
