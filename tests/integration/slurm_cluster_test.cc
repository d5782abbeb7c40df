// The test Slurm cluster (tests/support/slurm_cluster.h) works: a step across
// both nodes, a batch job whose steps run on both nodes, and scancel ending a
// running job and its tasks; nothing is left once the cluster is gone. Needs
// root and Debian's slurmctld, slurmd, slurm-client and munge; skips otherwise.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <thread>

#include "slurm_cluster.h"
#include "subprocess.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

std::vector<std::string> split_words(const std::string& line) {
  std::vector<std::string> words;
  std::stringstream ss(line);
  std::string w;
  while (ss >> w) words.push_back(w);
  return words;
}

// "pid: command line" of every process whose command line is `argv` (when not
// empty; the program may be named by its path, as srun does) and whose command
// line or environment contains `text`.
std::vector<std::string> processes(const std::vector<std::string>& argv, const std::string& text) {
  std::string want;
  for (size_t i = 1; i < argv.size(); ++i) want += argv[i] + '\0';
  std::vector<std::string> found;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::string pid = it->path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos || pid == std::to_string(getpid()))
      continue;
    const std::string cmdline = read_file("/proc/" + pid + "/cmdline");
    if (cmdline.empty()) continue;
    if (!argv.empty()) {
      const std::string program = cmdline.substr(0, cmdline.find('\0'));
      const std::string args = cmdline.substr(program.size() + 1);
      if (program.substr(program.rfind('/') + 1) != argv[0] || args != want) continue;
    }
    if (cmdline.find(text) == std::string::npos &&
        read_file("/proc/" + pid + "/environ").find(text) == std::string::npos) {
      continue;
    }
    std::string shown = cmdline;
    std::replace(shown.begin(), shown.end(), '\0', ' ');
    found.push_back(pid + ": " + shown);
  }
  return found;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

TEST(SlurmCluster, TwoNodesRunAStepAndABatchJob) {
  const std::string why = SlurmCluster::unavailable();
  if (!why.empty()) {
    std::printf("skipped: %s\n", why.c_str());
    GTEST_SKIP() << why;
  }
  std::string dir;
  std::vector<std::string> namespaces;
  {
    SlurmCluster cluster(2);
    dir = cluster.dir();
    for (int i = 0; i < cluster.size(); ++i) namespaces.push_back(cluster.hosts().on(i, {})[3]);
    std::printf("bring-up took %.2f s (cluster in %s)\n", cluster.bring_up_seconds(), dir.c_str());

    // A step across both nodes.
    ProcessResult step =
        run_process(cluster.on_login({"srun", "-N2", "--ntasks-per-node=1", "sh", "-c",
                                      "echo $SLURM_NODEID $SLURM_STEP_NODELIST $SLURM_JOB_ID "
                                      "$SLURM_STEP_ID $SLURMD_NODENAME"}),
                    {}, 60s);
    ASSERT_TRUE(step.exited) << "srun hung\n" << cluster.logs();
    ASSERT_EQ(step.code, 0) << step.out << step.err << cluster.logs();
    std::printf("srun took %.2f s:\n%s", step.seconds, step.out.c_str());
    std::vector<std::string> lines = split_lines(step.out);
    std::sort(lines.begin(), lines.end());
    ASSERT_EQ(lines.size(), 2u) << step.out << step.err;
    for (int node = 0; node < 2; ++node) {
      const auto w = split_words(lines[static_cast<size_t>(node)]);
      ASSERT_EQ(w.size(), 5u) << lines[static_cast<size_t>(node)];
      EXPECT_EQ(w[0], std::to_string(node));
      EXPECT_EQ(w[1], "n[1-2]");
      EXPECT_FALSE(w[2].empty());
      EXPECT_EQ(w[3], "0");
      EXPECT_EQ(w[4], cluster.node_name(node));
    }
    EXPECT_EQ(split_words(lines[0])[2], split_words(lines[1])[2]) << "one job";

    // What a task of a two-node step sees (for the launcher's Slurm support).
    ProcessResult env = run_process(
        cluster.on_login({"srun", "-N2", "--ntasks-per-node=1", "sh", "-c",
                          "if [ \"$SLURM_PROCID\" = 0 ]; then env | sort | grep ^SLURM; fi"}),
        {}, 60s);
    ASSERT_EQ(env.code, 0) << env.out << env.err << cluster.logs();
    std::printf(
        "environment of task 0 of `srun -N2 --ntasks-per-node=1` (from the login node):\n%s",
        env.out.c_str());
    EXPECT_NE(env.out.find("SLURM_PROCID=0"), std::string::npos) << env.out;

    // A batch job whose steps run on both nodes.
    write_file(dir + "/job.sh",
               "#!/bin/sh\n"
               "srun sh -c 'echo \"task $SLURM_PROCID on $(hostname) node $SLURMD_NODENAME\"'\n"
               "srun sh -c 'if [ \"$SLURM_PROCID\" = 0 ]; then env | sort | grep ^SLURM > " +
                   dir + "/batch_task_env.txt; fi'\n");
    ProcessResult batch =
        run_process(cluster.on_login({"sbatch", "--wait", "-N2", "--ntasks-per-node=1", "-o",
                                      dir + "/out.txt", dir + "/job.sh"}),
                    {}, 60s);
    ASSERT_TRUE(batch.exited) << "sbatch --wait hung\n" << cluster.logs();
    ASSERT_EQ(batch.code, 0) << batch.out << batch.err << read_file(dir + "/out.txt")
                             << cluster.logs();
    const std::string out = read_file(dir + "/out.txt");
    std::printf("sbatch --wait took %.2f s; out.txt:\n%s", batch.seconds, out.c_str());
    EXPECT_NE(out.find("task 0 on n1 node n1"), std::string::npos) << out;
    EXPECT_NE(out.find("task 1 on n2 node n2"), std::string::npos) << out;
    std::printf("environment of task 0 of `srun` in `sbatch -N2 --ntasks-per-node=1`:\n%s",
                read_file(dir + "/batch_task_env.txt").c_str());

    // scancel ends a running batch job and its tasks.
    write_file(dir + "/sleep.sh", "#!/bin/sh\nsrun sleep 100\n");
    ProcessResult submit =
        run_process(cluster.on_login({"sbatch", "--parsable", "-N2", "--ntasks-per-node=1", "-o",
                                      dir + "/sleep.txt", dir + "/sleep.sh"}),
                    {}, 30s);
    ASSERT_EQ(submit.code, 0) << submit.out << submit.err << cluster.logs();
    const std::string job = split_words(submit.out).at(0);
    const auto started = std::chrono::steady_clock::now();
    const bool sleeping = wait_until(
        [&] {
          std::this_thread::sleep_for(50ms);
          return processes({"sleep", "100"}, cluster.conf()).size() == 2;
        },
        30s);
    ASSERT_TRUE(sleeping) << joined(processes({"sleep", "100"}, cluster.conf())) << cluster.logs();
    std::printf("job %s running its 2 tasks after %.2f s\n", job.c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    const auto cancelled = std::chrono::steady_clock::now();
    ProcessResult cancel = run_process(cluster.on_login({"scancel", job}), {}, 30s);
    ASSERT_EQ(cancel.code, 0) << cancel.out << cancel.err << cluster.logs();
    std::string queue;
    const bool ended = wait_until(
        [&] {
          std::this_thread::sleep_for(50ms);
          ProcessResult q = run_process(cluster.on_login({"squeue", "-h"}), {}, 10s);
          queue = q.out + q.err;
          return q.exited && q.code == 0 && q.out.empty();
        },
        30s);
    EXPECT_TRUE(ended) << "squeue still shows:\n" << queue << cluster.logs();
    const bool no_sleep = wait_until(
        [&] {
          std::this_thread::sleep_for(50ms);
          return processes({"sleep", "100"}, cluster.conf()).empty();
        },
        15s);
    EXPECT_TRUE(no_sleep) << joined(processes({"sleep", "100"}, cluster.conf()));
    std::printf(
        "scancel: queue empty and tasks gone after %.2f s\n",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - cancelled).count());
  }
  // Nothing is left: no process of the cluster, no namespace, no directory.
  EXPECT_EQ(joined(processes({}, dir)), "");
  ProcessResult netns = run_process({"ip", "netns", "list"}, {}, 10s);
  for (const auto& ns : namespaces) EXPECT_EQ(netns.out.find(ns), std::string::npos) << netns.out;
  EXPECT_FALSE(std::filesystem::exists(dir)) << dir;
}

}  // namespace
}  // namespace ddp::testing
