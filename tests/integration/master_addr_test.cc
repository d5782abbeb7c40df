// MASTER_ADDR on a real cluster's /etc/hosts: on Debian and Ubuntu a host's
// own name is on a 127.0.1.1 line. With --master_addr=node0 on every node,
// each rank must get "node0" and resolve it itself (torchrun's behaviour),
// never node 0's loopback address; node 0 advertises a reachable address.

#include <gtest/gtest.h>

#include <memory>

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

class MasterAddr : public NetnsTest {
 protected:
  void SetUp() override {
    NetnsTest::SetUp();
    if (IsSkipped()) return;
    hosts_ = std::make_unique<NetnsHosts>(2);
    hosts_->name_hosts({"node0", "node1"}, /*own_name_on_loopback=*/true);
  }
  // The static form, the same command on both hosts but the node rank.
  std::vector<std::unique_ptr<Subprocess>> start(
      const std::vector<std::string>& program, const std::map<std::string, std::string>& env = {}) {
    std::vector<std::unique_ptr<Subprocess>> nodes;
    for (int i = 0; i < 2; ++i) {
      std::vector<std::string> args = {
          kDdprun,
          "--nnodes=2",
          "--node_rank=" + std::to_string(i),
          "--master_addr=node0",
          "--master_port=29500",
          "--nproc_per_node=1",
          "--rdzv_conf=heartbeat_interval=0.2,heartbeat_timeout=2,join_timeout=20"};
      args.insert(args.end(), program.begin(), program.end());
      nodes.push_back(std::make_unique<Subprocess>(hosts_->on(i, args), env));
    }
    return nodes;
  }
  std::unique_ptr<NetnsHosts> hosts_;
};

TEST_F(MasterAddr, EveryRankGetsTheNameAsGivenAndNodeZeroAdvertisesAReachableAddress) {
  auto nodes = start({kWorker, "env"});
  for (int i = 0; i < 2; ++i) {
    auto r = nodes[i]->wait(30s);
    ASSERT_EQ(r.code, 0) << r.err << r.out;
    EXPECT_EQ(lines_with_prefix(r.out, "[rank " + std::to_string(i) + "] ENV MASTER_ADDR="),
              std::vector<std::string>{"node0"})
        << r.out;
  }
  EXPECT_NE(nodes[0]->read_err().find("advertising " + hosts_->address(0)), std::string::npos)
      << nodes[0]->read_err();
}

// The test hosts share this machine's hostname, which none of them can
// resolve, so Gloo is told its interface (as on a multi-homed cluster).
TEST_F(MasterAddr, TorchDdpTrainsAcrossTheHostsWithTheName) {
  if (auto reason = torch2_unavailable_reason(); !reason.empty()) GTEST_SKIP() << reason;
  auto nodes = start({kTrainScript, "--epochs", "1", "--samples", "256"},
                     {{"DDP_PYTHON", torch2_python()}, {"GLOO_SOCKET_IFNAME", "eth0"}});
  std::string weights[2];
  for (int i = 0; i < 2; ++i) {
    auto r = nodes[i]->wait(80s);
    ASSERT_TRUE(r.exited) << "host " << i
                          << " did not finish (rank waiting for a store on loopback?)\n"
                          << nodes[i]->read_err();
    ASSERT_EQ(r.code, 0) << r.err << r.out;
    auto lines = lines_with_prefix(r.out, "[rank " + std::to_string(i) + "] FINAL_WEIGHTS ");
    ASSERT_EQ(lines.size(), 1u) << r.out;
    weights[i] = lines[0].substr(lines[0].find(' '));  // without "rank=N"
  }
  EXPECT_EQ(weights[0], weights[1]) << "replicas diverged";
}

}  // namespace
}  // namespace ddp::testing
