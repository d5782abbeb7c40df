// Live recovery on the GPU engine (--backend nccl): the survivors abort the
// NCCL communicator of the epoch a rank died in and form the next epoch's, a
// relaunch receives the weights and optimizer state over NCCL, and the run
// ends as every heal test does (heal_run.h).
//
// Three ddprun nodes on this machine, one rank each on CUDA device 0 (every
// node's LOCAL_RANK is 0), so one GPU is enough. NCCL refuses two ranks of
// one communicator on one GPU of one host; each node tells NCCL it is a host
// of its own (NCCL_HOSTID), and NCCL connects the ranks over loopback
// sockets, as it would across machines. Skips, saying why, without a GPU.

#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "heal_run.h"
#include "train_gpu_probe.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;

// Node `node` of `nnodes`, one rank, its rendezvous on node 0 at `port`.
std::unique_ptr<Subprocess> gpu_node(int nnodes, int node, int port,
                                     const std::vector<std::string>& faults,
                                     const std::vector<std::string>& train) {
  const std::vector<std::string> launcher = {
      "--nnodes=" + std::to_string(nnodes), "--node_rank=" + std::to_string(node),
      "--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--rdzv_id=heal-gpu",
      "--rdzv_conf=heartbeat_interval=0.2,heartbeat_timeout=2,join_timeout=20"};
  std::map<std::string, std::string> env = kEnv;
  env["NCCL_HOSTID"] = "heal-gpu-node" + std::to_string(node);
  env["NCCL_SOCKET_IFNAME"] = "lo";
  return std::make_unique<Subprocess>(heal_argv(1, launcher, faults, train), env);
}

TEST(HealGpu, RanksKilledBetweenStepsAndMidStepAreReplacedOverNccl) {
  REQUIRE_TRAIN_GPUS(kWorker, 1);
  const std::string dir = make_temp_dir();
  std::vector<std::string> args = train_args(dir, 1000);
  for (const char* a : {"--backend", "nccl", "--optimizer", "adam"}) args.push_back(a);
  const int port = free_port();
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int node = 0; node < 3; ++node) {
    nodes.push_back(gpu_node(
        3, node, port,
        node == 2 ? std::vector<std::string>{"--kill", "2@150"} : std::vector<std::string>{},
        args));
  }
  const bool killed = kill_after_committing(dir, 1, 500);
  HealRun run = gather(nodes, dir, 150s);
  ASSERT_TRUE(killed) << run.result.out << run.result.err;
  expect_healed(run, 3, 1000);
  const std::string& out = run.result.out;
  EXPECT_NE(out.find("math on cuda:0"), std::string::npos) << out;
  EXPECT_TRUE(dropped(out, 1) && dropped(out, 2)) << out;
  EXPECT_NE(out.find("[rank 1] heal: joined epoch"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 2] heal: joined epoch"), std::string::npos) << out;
  // The figures of each recovery, for the record.
  const std::regex line(R"(\[rank \d+\] heal: (epoch \d+: .*|step \d+ committed .*))");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) {
    std::cout << "  " << it->str() << "\n";
  }
}

}  // namespace
}  // namespace ddp::testing
