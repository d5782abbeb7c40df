// ddprun under a real Slurm cluster (tests/support/slurm_cluster.h: slurmctld
// and two slurmd nodes, each a test host with its own address and name):
// `srun ddprun` forms one job from Slurm's variables, a PyTorch program runs
// across both nodes, scancel leaves nothing behind, a failing rank is named,
// misuse is an error, SIGUSR1 reaches the workers. Needs root and Debian's
// Slurm and MUNGE packages; skips otherwise.

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>
#include <thread>

#include "rdzv_output.h"
#include "slurm_cluster.h"
#include "subprocess.h"
#include "torch_env.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
const std::string kDdprun = DDPRUN_PATH;
const std::string kWorker = TEST_WORKER_PATH;

class Slurm : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = SlurmCluster::unavailable();
    if (!why.empty()) {
      std::printf("skipped: %s\n", why.c_str());
      GTEST_SKIP() << why;
    }
    cluster_ = std::make_unique<SlurmCluster>(2);
  }
  // `srun ARGS...` on the login node, bounded.
  ProcessResult srun(std::vector<std::string> args, std::chrono::seconds limit = 60s) {
    args.insert(args.begin(), "srun");
    return run_process(cluster_->on_login(args), {}, limit);
  }
  // Submits `script` on both nodes, one task each; its job id, or "" (a test failure).
  std::string sbatch(const std::string& script, const std::string& output) {
    ProcessResult submit =
        run_process(cluster_->on_login({"sbatch", "--parsable", "-N2", "--ntasks-per-node=1", "-o",
                                        output, script}),
                    {}, 30s);
    EXPECT_EQ(submit.code, 0) << submit.out << submit.err << cluster_->logs();
    return submit.code == 0 ? submit.out.substr(0, submit.out.find_first_of(";\n")) : "";
  }
  // The value of NAME that rank printed with test_worker's "env" mode.
  static std::string env_of(const std::string& out, int rank, const std::string& name) {
    auto lines = lines_with_prefix(out, "[rank " + std::to_string(rank) + "] ENV " + name + "=");
    return lines.empty() ? "<missing>" : lines.front().substr(lines.front().find('=') + 1);
  }
  std::unique_ptr<SlurmCluster> cluster_;
};

TEST_F(Slurm, SrunOfDdprunOnTwoNodesIsOneJob) {
  ProcessResult r =
      srun({"-N2", "--ntasks-per-node=1", kDdprun, "--nproc_per_node=2", kWorker, "env"});
  ASSERT_TRUE(r.exited) << cluster_->logs();
  ASSERT_EQ(r.code, 0) << r.out << r.err << cluster_->logs();
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(env_of(r.out, rank, "WORLD_SIZE"), "4") << r.out;
    EXPECT_EQ(env_of(r.out, rank, "LOCAL_RANK"), std::to_string(rank % 2)) << r.out;
    EXPECT_EQ(env_of(r.out, rank, "GROUP_RANK"), std::to_string(rank / 2)) << r.out;
    EXPECT_EQ(env_of(r.out, rank, "LOCAL_WORLD_SIZE"), "2") << r.out;
    // The step's first host as Slurm names it, which each node resolves (as
    // torchrun users write MASTER_ADDR=$(scontrol show hostnames | head -n1)).
    EXPECT_EQ(env_of(r.out, rank, "MASTER_ADDR"), cluster_->node_name(0)) << r.out;
  }
  EXPECT_NE(r.err.find("took 2 node(s) (SLURM_STEP_NUM_NODES)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("node rank 1 (SLURM_NODEID)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("first host of SLURM_STEP_NODELIST=n[1-2]"), std::string::npos) << r.err;
}

TEST_F(Slurm, APytorchGlooProgramRunsAcrossBothNodes) {
  const std::string why = torch2_unavailable_reason();
  if (!why.empty()) {
    std::printf("skipped: %s\n", why.c_str());
    GTEST_SKIP() << why;
  }
  const std::string script = cluster_->dir() + "/allreduce.py";
  write_file(
      script,
      "import os, torch, torch.distributed as dist\n"
      "dist.init_process_group('gloo')\n"
      "t = torch.tensor([float(dist.get_rank() + 1)])\n"
      "dist.all_reduce(t)\n"
      "print('TORCH rank=%d world=%d local=%s sum=%g' % (dist.get_rank(), dist.get_world_size(),\n"
      "      os.environ['LOCAL_RANK'], t.item()), flush=True)\n"
      "dist.destroy_process_group()\n");
  ProcessResult r = srun(
      {"-N2", "--ntasks-per-node=1", kDdprun, "--nproc_per_node=2", torch2_python(), script}, 120s);
  ASSERT_TRUE(r.exited) << cluster_->logs();
  ASSERT_EQ(r.code, 0) << r.out << r.err << cluster_->logs();
  for (int rank = 0; rank < 4; ++rank) {
    const std::string want = "TORCH rank=" + std::to_string(rank) +
                             " world=4 local=" + std::to_string(rank % 2) + " sum=10";
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out << r.err;
  }
}

TEST_F(Slurm, ScancelOfABatchJobLeavesNoWorkerAndNoSharedMemory) {
  const std::string dir = cluster_->dir() + "/pids";
  std::filesystem::create_directories(dir);
  const std::string job_script = cluster_->dir() + "/job.sh";
  // Each ddprun's stderr goes to a file of its own, written by its node's
  // slurmstepd: what ddprun logs after its workers are gone is not lost with
  // srun, which scancel ends first.
  const std::string logs = cluster_->dir() + "/logs";
  std::filesystem::create_directories(logs);
  write_file(job_script, "#!/bin/sh\nsrun --error=" + logs + "/ddprun-%t.err " + kDdprun +
                             " --nproc_per_node=2 " + kWorker + " hold " + dir + "\n");
  const std::string job = sbatch(job_script, cluster_->dir() + "/job.out");
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(wait_until([&] { return read_pids(dir, "").size() == 8; },
                         60s))  // 4 workers + their children
      << read_file(cluster_->dir() + "/job.out") << cluster_->logs();
  const std::set<pid_t> pids = read_pids(dir, "");
  const auto cancelled = std::chrono::steady_clock::now();
  ProcessResult cancel = run_process(cluster_->on_login({"scancel", job}), {}, 30s);
  ASSERT_EQ(cancel.code, 0) << cancel.err;
  for (pid_t pid : pids) {
    EXPECT_TRUE(wait_until([&] { return !process_alive(pid); }, 10s))
        << "pid " << pid << " outlived scancel";
  }
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - cancelled).count();
  // The workers end on SIGTERM; what they left (a child ignoring SIGTERM) is
  // killed by ddprun as soon as they are gone, long before Slurm's KillWait.
  EXPECT_LT(took, 7.0);
  // No segment of the job's run is left in /dev/shm (its names carry the run id).
  const std::string run = "slurm-" + job + ".0";
  EXPECT_TRUE(wait_until(
      [&] {
        for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
          if (e.path().filename().string().find(run) != std::string::npos) return false;
        }
        return true;
      },
      5s));
  // ddprun stopped its workers on SIGTERM (Slurm's, before its SIGKILL) and said so.
  auto ddprun_logs = [&] {
    return read_file(logs + "/ddprun-0.err") + read_file(logs + "/ddprun-1.err");
  };
  EXPECT_TRUE(
      wait_until([&] { return ddprun_logs().find("after SIGTERM") != std::string::npos; }, 10s))
      << ddprun_logs() << read_file(cluster_->dir() + "/job.out");
}

TEST_F(Slurm, AFailingRankFailsTheStepAndIsNamed) {
  ProcessResult r = srun(
      {"-N2", "--ntasks-per-node=1", kDdprun, "--nproc_per_node=2", kWorker, "fail", "3", "7"});
  ASSERT_TRUE(r.exited) << cluster_->logs();
  EXPECT_NE(r.code, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find("rank 3"), std::string::npos) << all;
  EXPECT_NE(all.find("exit code 7"), std::string::npos) << all;
}

TEST_F(Slurm, TwoDdprunTasksOnOneNodeIsAnError) {
  ProcessResult r =
      srun({"-N1", "--ntasks-per-node=2", kDdprun, "--nproc_per_node=1", kWorker, "env"});
  ASSERT_TRUE(r.exited) << cluster_->logs();
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("srun started 2 ddprun tasks on this node"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("ENV RANK="), std::string::npos) << "a worker ran:\n" << r.out;
}

TEST_F(Slurm, Sigusr1FromScancelReachesTheWorkersAndTheJobGoesOn) {
  const std::string dir = cluster_->dir() + "/usr1";
  std::filesystem::create_directories(dir);
  const std::string job_script = cluster_->dir() + "/usr1.sh";
  write_file(job_script, "#!/bin/sh\nsrun " + kDdprun + " --nproc_per_node=2 " + kWorker +
                             " on-usr1 " + dir + "\n");
  const std::string job = sbatch(job_script, cluster_->dir() + "/usr1.out");
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(wait_until([&] { return read_pids(dir, "pid_").size() == 4; }, 60s))
      << read_file(cluster_->dir() + "/usr1.out");
  ProcessResult notice =
      run_process(cluster_->on_login({"scancel", "--signal=USR1", job}), {}, 30s);
  ASSERT_EQ(notice.code, 0) << notice.err;
  // The workers "checkpoint" and exit 0: the job completes.
  ASSERT_TRUE(wait_until(
      [&] {
        std::this_thread::sleep_for(100ms);
        ProcessResult q = run_process(cluster_->on_login({"squeue", "-h", "-j", job}), {}, 10s);
        return q.exited && q.out.empty();
      },
      30s))
      << read_file(cluster_->dir() + "/usr1.out");
  const std::string out = read_file(cluster_->dir() + "/usr1.out");
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(out.find("rank " + std::to_string(rank) + " got SIGUSR1"), std::string::npos) << out;
  }
  EXPECT_NE(out.find("forwarded SIGUSR1"), std::string::npos) << out;
  ProcessResult state = run_process(cluster_->on_login({"scontrol", "show", "job", job}), {}, 10s);
  ASSERT_EQ(state.code, 0) << state.err;
  EXPECT_NE(state.out.find("JobState=COMPLETED"), std::string::npos) << state.out;
}

}  // namespace
}  // namespace ddp::testing
