// The static form's one port, as under torchrun 2.x: node rank 0's ddprun
// hosts the rendezvous on MASTER_PORT and serves torch.distributed's store
// there too (TORCHELASTIC_USE_AGENT_STORE=True: every rank is a TCPStore
// client). On two test hosts (network namespaces; root, else skipped), with
// MASTER_PORT+1 taken on node 0 by another program: torch 2.x and Debian's
// torch 1.13 DDP train to the same weights on both hosts, and a group whose
// rank fails once restarts into a round that forms and trains (the store
// holds nothing of the failed attempt).

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "debian_torch.h"
#include "netns_hosts.h"
#include "netns_test.h"
#include "subprocess.h"
#include "torch_env.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
const std::string kDdprun = DDPRUN_PATH;
const std::string kWorker = TEST_WORKER_PATH;
const std::string kTrainScript = TORCH_TRAIN_SCRIPT;
constexpr int kMasterPort = 29500;

class MultiHostTorchAgentStore : public NetnsTest {
 protected:
  void SetUp() override {
    NetnsTest::SetUp();
    if (IsSkipped()) return;
    hosts_ = std::make_unique<NetnsHosts>(2);
  }

  // Another program listening on MASTER_PORT+1 on node 0 (where ddprun's
  // rendezvous used to go), until the test ends.
  void take_next_port_on_node_zero() {
    squatter_ = std::make_unique<Subprocess>(
        hosts_->on(0, {kDebianPython, "-c",
                       "import socket, time\n"
                       "s = socket.socket(socket.AF_INET6)\n"
                       "s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)\n"
                       "s.bind(('::', " +
                           std::to_string(kMasterPort + 1) +
                           "))\n"
                           "s.listen()\n"
                           "print('listening', flush=True)\n"
                           "time.sleep(600)\n"}));
    ASSERT_TRUE(wait_until(
        [&] { return squatter_->read_out().find("listening") != std::string::npos; }, 10s))
        << squatter_->read_err();
  }

  // The same static-form command on both hosts but the node rank.
  std::vector<std::unique_ptr<Subprocess>> start(const std::vector<std::string>& launcher_args,
                                                 const std::vector<std::string>& program,
                                                 const std::map<std::string, std::string>& env) {
    std::vector<std::unique_ptr<Subprocess>> nodes;
    for (int i = 0; i < 2; ++i) {
      std::vector<std::string> args = {
          kDdprun,
          "--nnodes=2",
          "--node_rank=" + std::to_string(i),
          "--master_addr=" + hosts_->address(0),
          "--master_port=" + std::to_string(kMasterPort),
          "--nproc_per_node=1",
          "--rdzv_conf=heartbeat_interval=0.2,heartbeat_timeout=3,join_timeout=30"};
      args.insert(args.end(), launcher_args.begin(), launcher_args.end());
      args.insert(args.end(), program.begin(), program.end());
      nodes.push_back(std::make_unique<Subprocess>(hosts_->on(i, args), env));
    }
    return nodes;
  }

  // Both hosts exited 0 and their ranks printed the same FINAL_WEIGHTS.
  static void expect_equal_weights(std::vector<std::unique_ptr<Subprocess>>& nodes) {
    std::string weights[2];
    for (int i = 0; i < 2; ++i) {
      auto r = nodes[i]->wait(100s);
      ASSERT_TRUE(r.exited) << "host " << i << " did not finish\n"
                            << nodes[i]->read_out() << nodes[i]->read_err();
      ASSERT_EQ(r.code, 0) << "host " << i << "\n" << r.out << r.err;
      auto lines = lines_with_prefix(r.out, "[rank " + std::to_string(i) + "] FINAL_WEIGHTS ");
      ASSERT_EQ(lines.size(), 1u) << r.out;
      weights[i] = lines[0].substr(lines[0].find(' '));  // without "rank=N"
    }
    EXPECT_EQ(weights[0], weights[1]) << "replicas diverged";
  }

  static std::map<std::string, std::string> torch_env(const std::string& python) {
    // Every test host shares this machine's hostname: Gloo is told its interface.
    return {{"DDP_PYTHON", python}, {"GLOO_SOCKET_IFNAME", "eth0"}};
  }

  std::unique_ptr<NetnsHosts> hosts_;
  std::unique_ptr<Subprocess> squatter_;
};

TEST_F(MultiHostTorchAgentStore, EveryRankIsToldToUseTheStoreOnMasterPort) {
  take_next_port_on_node_zero();
  auto nodes = start({}, {kWorker, "env"}, {});
  for (int i = 0; i < 2; ++i) {
    auto r = nodes[i]->wait(30s);
    ASSERT_EQ(r.code, 0) << r.err << r.out;
    const std::string prefix = "[rank " + std::to_string(i) + "] ENV ";
    EXPECT_EQ(lines_with_prefix(r.out, prefix + "TORCHELASTIC_USE_AGENT_STORE="),
              std::vector<std::string>{"True"})
        << r.out;
    EXPECT_EQ(lines_with_prefix(r.out, prefix + "MASTER_PORT="),
              std::vector<std::string>{std::to_string(kMasterPort)})
        << r.out;
    EXPECT_EQ(lines_with_prefix(r.out, prefix + "DDP_RDZV_ENDPOINT="),
              std::vector<std::string>{hosts_->address(0) + ":" + std::to_string(kMasterPort)})
        << r.out;
  }
  const std::string err0 = nodes[0]->read_err();
  EXPECT_NE(err0.find("hosting the rendezvous on port " + std::to_string(kMasterPort)),
            std::string::npos)
      << err0;
  EXPECT_NE(err0.find("torch.distributed's store for the workers"), std::string::npos) << err0;
}

TEST_F(MultiHostTorchAgentStore, Torch2DdpTrainsToEqualWeightsWithOnlyMasterPortFree) {
  if (auto why = torch2_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  take_next_port_on_node_zero();
  auto nodes =
      start({}, {kTrainScript, "--epochs", "1", "--samples", "256"}, torch_env(torch2_python()));
  expect_equal_weights(nodes);
}

TEST_F(MultiHostTorchAgentStore, DebianTorch113DdpTrainsToEqualWeightsWithOnlyMasterPortFree) {
  if (auto why = torch_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  take_next_port_on_node_zero();
  auto nodes =
      start({}, {kTrainScript, "--epochs", "1", "--samples", "256"}, torch_env(kDebianPython));
  expect_equal_weights(nodes);
}

// Rank 1 dies in the first attempt's first epoch, after init_process_group
// and DDP have written their keys (torch 2.x's carry no attempt prefix); the
// restarted round must find an empty store, form and train.
TEST_F(MultiHostTorchAgentStore, Torch2GroupRestartsAfterARankFailsOnce) {
  if (auto why = torch2_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  take_next_port_on_node_zero();
  const std::string dir = make_temp_dir();
  const std::string once = dir + "/crash_once.py";
  write_file(once,
             "import os, runpy, sys\n"
             "if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':\n"
             "    sys.argv += ['--crash-rank', '1']\n"
             "sys.argv[0] = " +
                 std::string("'") + kTrainScript +
                 "'\n"
                 "runpy.run_path(sys.argv[0], run_name='__main__')\n");
  auto nodes = start({"--max_restarts=1"}, {once, "--epochs", "1", "--samples", "256"},
                     torch_env(torch2_python()));
  expect_equal_weights(nodes);
  for (int i = 0; i < 2; ++i) {
    EXPECT_NE(nodes[i]->read_err().find("round 2: 2 node(s)"), std::string::npos)
        << nodes[i]->read_err();
  }
  EXPECT_NE(nodes[1]->read_err().find("rank 1"), std::string::npos) << nodes[1]->read_err();
}

}  // namespace
}  // namespace ddp::testing
