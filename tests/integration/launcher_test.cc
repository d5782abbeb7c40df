// ddprun as a user runs it: real processes, real files. The environment
// each worker gets, the program's arguments and interpreter, the output's
// prefixes, filters and files, and CPU binding; launcher_lifecycle_test.cc
// has failures, signals, teardown and restarts.

#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "launcher_harness.h"
#include "subprocess.h"

namespace ddp::testing {
namespace {

using namespace launcher_test;

class EnvContract : public ::testing::TestWithParam<int> {};

TEST_P(EnvContract, EveryWorkerGetsTorchrunsVariables) {
  const int n = GetParam();
  auto r = ddprun({"--nproc_per_node=" + std::to_string(n), "--run_id=job42", kWorker, "env"},
                  {{"OMP_NUM_THREADS", "\x01"}, {"RANK", "77"}});
  ASSERT_TRUE(r.exited);
  ASSERT_EQ(r.code, 0) << r.err;
  auto envs = env_by_rank(r.out);
  ASSERT_EQ(static_cast<int>(envs.size()), n) << r.out;
  std::set<std::string> ports;
  for (int rank = 0; rank < n; ++rank) {
    auto& e = envs[rank];
    EXPECT_EQ(e["RANK"], std::to_string(rank));
    EXPECT_EQ(e["LOCAL_RANK"], std::to_string(rank));
    EXPECT_EQ(e["ROLE_RANK"], std::to_string(rank));
    EXPECT_EQ(e["GROUP_RANK"], "0");
    EXPECT_EQ(e["WORLD_SIZE"], std::to_string(n));
    EXPECT_EQ(e["LOCAL_WORLD_SIZE"], std::to_string(n));
    EXPECT_EQ(e["ROLE_WORLD_SIZE"], std::to_string(n));
    EXPECT_EQ(e["GROUP_WORLD_SIZE"], "1");
    EXPECT_EQ(e["ROLE_NAME"], "default");
    EXPECT_EQ(e["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(e["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(e["TORCHELASTIC_MAX_RESTARTS"], "0");
    EXPECT_EQ(e["TORCHELASTIC_RUN_ID"], "job42");
    EXPECT_EQ(e["DDP_RUN_ID"], "job42");
    EXPECT_EQ(e["OMP_NUM_THREADS"], n > 1 ? "1" : "<unset>");
    int port = std::stoi(e["MASTER_PORT"]);
    EXPECT_GT(port, 0);
    EXPECT_LT(port, 65536);
    ports.insert(e["MASTER_PORT"]);
  }
  EXPECT_EQ(ports.size(), 1u) << "every rank must see the same MASTER_PORT";
  if (n > 1) {
    EXPECT_NE(r.err.find("OMP_NUM_THREADS=1"), std::string::npos) << r.err;
  }
}

INSTANTIATE_TEST_SUITE_P(Workers, EnvContract, ::testing::Values(1, 4, 8));

TEST(Launcher, UserOmpNumThreadsIsKept) {
  auto r = ddprun({"--nproc_per_node=2", kWorker, "env"}, {{"OMP_NUM_THREADS", "3"}});
  ASSERT_EQ(r.code, 0) << r.err;
  auto envs = env_by_rank(r.out);
  EXPECT_EQ(envs[0]["OMP_NUM_THREADS"], "3");
  EXPECT_EQ(envs[1]["OMP_NUM_THREADS"], "3");
  EXPECT_EQ(r.err.find("OMP_NUM_THREADS=1"), std::string::npos);
}

TEST(Launcher, ArgumentsAfterTheProgramPassUntouched) {
  auto r =
      ddprun({"--nproc_per_node=1", kWorker, "args", "--nproc_per_node=7", "--", "-m", "x y", ""});
  ASSERT_EQ(r.code, 0) << r.err;
  auto args = lines_with_prefix(r.out, "[rank 0] ARG ");
  std::vector<std::string> expected = {"--nproc_per_node=7", "--", "-m", "x y"};
  ASSERT_GE(args.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(args[i], expected[i]);
}

TEST(Launcher, LeadingDoubleDashIsDropped) {
  auto r = ddprun({"--nproc_per_node=1", "--", kWorker, "args", "a"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(lines_with_prefix(r.out, "[rank 0] ARG "), std::vector<std::string>{"a"});
}

TEST(Launcher, UnknownLauncherOptionIsAnErrorAndStartsNothing) {
  auto dir = make_temp_dir();
  auto r = ddprun({"--nproc_per_node=1", "--bogus", kWorker, "hold", dir});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--bogus"), std::string::npos) << r.err;
  EXPECT_TRUE(read_pids(dir, "pid_").empty());
}

TEST(Launcher, PythonProgramRunsUnderTheInterpreter) {
  auto dir = make_temp_dir();
  write_file(dir + "/hello.py", "import os, sys\nprint('py', os.environ['RANK'], sys.argv[1:])\n");
  auto r = ddprun({"--nproc_per_node=2", dir + "/hello.py", "--x"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("[rank 0] py 0 ['--x']"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 1] py 1 ['--x']"), std::string::npos) << r.out;
}

TEST(Launcher, ModuleFlagRunsPythonDashM) {
  auto dir = make_temp_dir();
  write_file(dir + "/mymod.py", "import os\nprint('module rank', os.environ['RANK'])\n");
  auto r = ddprun({"-m", "--nproc_per_node=1", "mymod"}, {{"PYTHONPATH", dir}});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("[rank 0] module rank 0"), std::string::npos) << r.out;
}

TEST(Launcher, NoPythonRunsAPyFileDirectly) {
  auto dir = make_temp_dir();
  write_file(dir + "/script.py", "#!/bin/sh\necho direct $RANK\n");
  chmod((dir + "/script.py").c_str(), 0755);
  auto r = ddprun({"--no_python", "--nproc_per_node=1", dir + "/script.py"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("[rank 0] direct 0"), std::string::npos) << r.out;
}

TEST(Launcher, PrefixesEveryLineAndCanTurnItOff) {
  auto r = ddprun({"--nproc_per_node=2", "sh", "-c", "echo out; echo err >&2"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("[rank 0] out\n"), std::string::npos);
  EXPECT_NE(r.out.find("[rank 1] out\n"), std::string::npos);
  EXPECT_NE(r.err.find("[rank 1] err\n"), std::string::npos);
  auto plain = ddprun({"--no-prefix", "--nproc_per_node=1", "sh", "-c", "echo out"});
  EXPECT_EQ(plain.out, "out\n");
}

// "0-2,5" (a Cpus_allowed_list) as {0, 1, 2, 5}.
std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> cpus;
  std::stringstream items(text);
  for (std::string item; std::getline(items, item, ',');) {
    const auto dash = item.find('-');
    const int first = std::stoi(item.substr(0, dash));
    const int last = dash == std::string::npos ? first : std::stoi(item.substr(dash + 1));
    for (int c = first; c <= last; ++c) cpus.push_back(c);
  }
  return cpus;
}

// Each rank's CPUs as the kernel reports them, from "[rank R] Cpus_allowed_list:\tLIST".
std::map<int, std::vector<int>> cpus_by_rank(const std::string& out) {
  std::map<int, std::vector<int>> result;
  for (const auto& line : lines_with_prefix(out, "[rank ")) {
    const auto tab = line.find('\t');
    if (line.find("Cpus_allowed_list:") == std::string::npos || tab == std::string::npos) continue;
    result[std::stoi(line)] = parse_cpu_list(line.substr(tab + 1));
  }
  return result;
}

const std::vector<std::string> kPrintCpus = {"sh", "-c",
                                             "grep Cpus_allowed_list /proc/self/status"};

TEST(Launcher, BindCoresToRankGivesEachLocalRankItsOwnSliceOfDdprunsCpus) {
  cpu_set_t mask;
  ASSERT_EQ(sched_getaffinity(0, sizeof mask, &mask), 0);
  std::vector<int> allowed;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &mask)) allowed.push_back(c);
  }
  ASSERT_FALSE(allowed.empty());
  const int n = std::min<int>(static_cast<int>(allowed.size()), 4);
  const std::string nproc = "--nproc_per_node=" + std::to_string(n);

  // Without the flag every worker inherits ddprun's mask.
  auto free = ddprun({nproc, kPrintCpus[0], kPrintCpus[1], kPrintCpus[2]});
  ASSERT_EQ(free.code, 0) << free.err;
  const auto inherited = cpus_by_rank(free.out);
  ASSERT_EQ(inherited.size(), static_cast<std::size_t>(n)) << free.out;
  for (const auto& [rank, cpus] : inherited) EXPECT_EQ(cpus, allowed) << "rank " << rank;

  // With it: disjoint, non-empty, ascending slices that together are ddprun's mask.
  auto bound = ddprun({nproc, "--bind_cores_to_rank", kPrintCpus[0], kPrintCpus[1], kPrintCpus[2]});
  ASSERT_EQ(bound.code, 0) << bound.err;
  EXPECT_NE(bound.err.find("--bind_cores_to_rank: " + std::to_string(allowed.size()) +
                           " CPU(s) for " + std::to_string(n) + " local rank(s)"),
            std::string::npos)
      << bound.err;
  const auto slices = cpus_by_rank(bound.out);
  ASSERT_EQ(slices.size(), static_cast<std::size_t>(n)) << bound.out;
  std::vector<int> together;
  for (const auto& [rank, cpus] : slices) {
    EXPECT_FALSE(cpus.empty()) << "rank " << rank;
    together.insert(together.end(), cpus.begin(), cpus.end());
  }
  EXPECT_EQ(together, allowed) << bound.out;
  // ... and the workers hear how many CPUs the node's ranks share (ddp::node_cpus()).
  auto told = ddprun({nproc, "--bind_cores_to_rank", "sh", "-c", "echo NODE_CPUS=$DDP_NODE_CPUS"},
                     {{"DDP_NODE_CPUS", "99"}});
  ASSERT_EQ(told.code, 0) << told.err;
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_NE(told.out.find("[rank " + std::to_string(rank) +
                            "] NODE_CPUS=" + std::to_string(allowed.size()) + "\n"),
              std::string::npos)
        << told.out;
  }

  // More ranks than CPUs (ddprun itself restricted with taskset): one CPU
  // each, in turn, so every CPU carries the same number of ranks.
  const std::vector<int> two(allowed.begin(),
                             allowed.begin() + std::min<std::size_t>(2, allowed.size()));
  std::string list = std::to_string(two[0]);
  if (two.size() > 1) list += "," + std::to_string(two[1]);
  auto over = run_process({"taskset", "-c", list, kDdprun, "--nproc_per_node=4",
                           "--bind_cores_to_rank", kPrintCpus[0], kPrintCpus[1], kPrintCpus[2]},
                          {}, 30s);
  ASSERT_EQ(over.code, 0) << over.err;
  const auto turns = cpus_by_rank(over.out);
  ASSERT_EQ(turns.size(), 4u) << over.out;
  for (const auto& [rank, cpus] : turns) {
    EXPECT_EQ(cpus, std::vector<int>{two[static_cast<std::size_t>(rank) % two.size()]})
        << "rank " << rank;
  }
}

TEST(Launcher, LocalRanksFilterShowsOnlyChosenRanks) {
  auto r = ddprun({"--nproc_per_node=4", "--local_ranks_filter=1,3", kWorker, "env"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto envs = env_by_rank(r.out);
  EXPECT_EQ(envs.size(), 2u);
  EXPECT_TRUE(envs.count(1) && envs.count(3));
  // torchrun's rule: ranks this node lacks are ignored (one list serves nodes of any size).
  auto wide = ddprun({"--nproc_per_node=2", "--local_ranks_filter=0,1,2,3", kWorker, "env"});
  ASSERT_EQ(wide.code, 0) << wide.err;
  EXPECT_EQ(env_by_rank(wide.out).size(), 2u);
  auto bad = ddprun({"--nproc_per_node=2", "--local_ranks_filter=x", kWorker, "env"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--local_ranks_filter=x"), std::string::npos);
}

TEST(Launcher, LogDirGetsRawPerRankFiles) {
  auto dir = make_temp_dir();
  auto r = ddprun({"--nproc_per_node=2", "--run_id=logs", "--log_dir=" + dir, kWorker, "binary"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::string expected;
  for (int b = 0; b < 256; ++b) expected += static_cast<char>(b);
  expected += "\ntail-without-newline";
  for (int rank = 0; rank < 2; ++rank) {
    auto base = run_dir(dir, "logs") + "/attempt_0/" + std::to_string(rank);
    EXPECT_EQ(read_file(base + "/stdout.log"), expected) << "rank " << rank;
    EXPECT_TRUE(std::filesystem::exists(base + "/stderr.log"));
  }
  // The console gets whole lines: the binary bytes intact, the tail finished with a newline.
  std::string line_with_bytes;
  for (int b = 0; b < 10; ++b) line_with_bytes += static_cast<char>(b);
  EXPECT_NE(r.out.find("[rank 0] " + line_with_bytes), std::string::npos);
  EXPECT_NE(r.out.find("[rank 1] tail-without-newline\n"), std::string::npos);
}

TEST(Launcher, RedirectsKeepStreamsOffTheConsoleAndTeeKeepsThemOn) {
  auto dir = make_temp_dir();
  auto r = ddprun({"--nproc_per_node=2", "--run_id=r", "--log_dir=" + dir, "--redirects=3",
                   "--tee=0:1", "sh", "-c", "echo out$RANK; echo err$RANK >&2"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("[rank 0] out0"), std::string::npos);  // tee'd
  EXPECT_EQ(r.out.find("out1"), std::string::npos);           // redirected
  EXPECT_EQ(r.err.find("err0"), std::string::npos);
  EXPECT_EQ(read_file(run_dir(dir, "r") + "/attempt_0/1/stdout.log"), "out1\n");
  EXPECT_EQ(read_file(run_dir(dir, "r") + "/attempt_0/0/stderr.log"), "err0\n");
}

}  // namespace
}  // namespace ddp::testing
