// Multi-node jobs on separate test hosts: each host is a network namespace
// with its own address (198.18.0.x), running its own ddprun, as torchrun's,
// Kubeflow's and elastic recipes launch them. Needs root; skips otherwise.

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "netns_hosts.h"
#include "netns_test.h"
#include "rdzv_output.h"
#include "subprocess.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
const std::string kDdprun = DDPRUN_PATH;
const std::string kWorker = TEST_WORKER_PATH;
// Fast liveness: a lost node is noticed in 2 s, a lonely join gives up in 20 s.
const std::string kFast = "heartbeat_interval=0.2,heartbeat_timeout=2,join_timeout=20";
const std::string kFastConf = "--rdzv_conf=" + kFast;

class MultiHost : public NetnsTest {
 protected:
  // ddprun on `host` with `args` (then the program).
  std::unique_ptr<Subprocess> start_on(const NetnsHosts& hosts, int host,
                                       std::vector<std::string> args,
                                       const std::map<std::string, std::string>& env = {}) {
    args.insert(args.begin(), kDdprun);
    return std::make_unique<Subprocess>(hosts.on(host, args), env);
  }
};

std::string env_of(const std::string& out, int rank, const std::string& name) {
  for (const auto& line :
       lines_with_prefix(out, "[rank " + std::to_string(rank) + "] ENV " + name + "=")) {
    return line;
  }
  return "<missing>";
}

TEST_F(MultiHost, StaticFormWithMasterAddrAndPort) {
  NetnsHosts hosts(2);
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i) {
    nodes.push_back(start_on(
        hosts, i,
        {"--nnodes=2", "--node_rank=" + std::to_string(i), "--master_addr=" + hosts.address(0),
         "--master_port=29500", "--nproc_per_node=2", kFastConf, kWorker, "env"}));
  }
  for (int i = 0; i < 2; ++i) {
    auto r = nodes[i]->wait(30s);
    ASSERT_EQ(r.code, 0) << r.err << r.out;
    for (int local = 0; local < 2; ++local) {
      const int rank = 2 * i + local;
      EXPECT_EQ(env_of(r.out, rank, "MASTER_ADDR"), hosts.address(0)) << r.out;
      EXPECT_EQ(env_of(r.out, rank, "MASTER_PORT"), "29500") << r.out;
      EXPECT_EQ(env_of(r.out, rank, "WORLD_SIZE"), "4") << r.out;
      EXPECT_EQ(env_of(r.out, rank, "GROUP_RANK"), std::to_string(i)) << r.out;
      EXPECT_EQ(env_of(r.out, rank, "TORCHELASTIC_RUN_ID"), "none") << r.out;
      EXPECT_EQ(env_of(r.out, rank, "TORCHELASTIC_USE_AGENT_STORE"), "True") << r.out;
    }
  }
  // One port, as under torchrun 2.x: the rendezvous listened on MASTER_PORT
  // and served the program's torch store there (agent_store_test.cc).
  EXPECT_NE(nodes[0]->read_err().find("hosting the rendezvous on port 29500"), std::string::npos)
      << nodes[0]->read_err();
  EXPECT_NE(nodes[0]->read_err().find("unauthenticated"), std::string::npos)
      << nodes[0]->read_err();
}

TEST_F(MultiHost, C10dFormSameCommandOnEveryHost) {
  NetnsHosts hosts(3);
  const std::vector<std::string> args = {"--nnodes=3",
                                         "--rdzv_backend=c10d",
                                         "--rdzv_endpoint=" + hosts.address(1) + ":29400",
                                         "--rdzv_id=job7",
                                         "--nproc_per_node=2",
                                         kFastConf,
                                         kWorker,
                                         "rdzv"};
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 3; ++i) nodes.push_back(start_on(hosts, i, args, {{"DDP_RDZV_TOKEN", "s3"}}));
  std::set<int> all;
  for (int i = 0; i < 3; ++i) {
    auto r = nodes[i]->wait(30s);
    ASSERT_EQ(r.code, 0) << r.err << r.out;
    auto ranks = ranks_ok(r.out);
    EXPECT_EQ(ranks.size(), 2u) << r.out;
    all.insert(ranks.begin(), ranks.end());
    // The host at the endpoint's address hosts the rendezvous, and only it.
    EXPECT_EQ(r.err.find("hosting the rendezvous") != std::string::npos, i == 1) << r.err;
    EXPECT_EQ(r.err.find("unauthenticated"), std::string::npos) << r.err;
  }
  EXPECT_EQ(all, (std::set<int>{0, 1, 2, 3, 4, 5}));
}

TEST_F(MultiHost, KubeflowPetVariablesOnly) {
  NetnsHosts hosts(2);
  // What a PyTorchJob gives each pod; the program gets no launcher flag.
  const std::map<std::string, std::string> env = {
      {"PET_NNODES", "1:3"},           {"PET_NPROC_PER_NODE", "2"},
      {"PET_RDZV_BACKEND", "c10d"},    {"PET_RDZV_ENDPOINT", hosts.address(0) + ":29400"},
      {"PET_RDZV_ID", "pytorchjob-1"}, {"PET_RDZV_CONF", kFast + ",last_call_timeout=1"}};
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i)
    nodes.push_back(start_on(hosts, i, {kWorker, "rdzv-at-size", "2"}, env));
  std::set<int> all;
  for (int i = 0; i < 2; ++i) {
    auto r = nodes[i]->wait(40s);
    ASSERT_EQ(r.code, 0) << r.err << r.out;
    auto ranks = ranks_ok(r.out);
    all.insert(ranks.begin(), ranks.end());
    EXPECT_NE(r.out.find("world=4"), std::string::npos) << r.out;
  }
  EXPECT_EQ(all, (std::set<int>{0, 1, 2, 3}));
}

TEST_F(MultiHost, ElasticSecondHostArrivesLate) {
  NetnsHosts hosts(2);
  const std::vector<std::string> args = {"--nnodes=1:2",
                                         "--rdzv_endpoint=" + hosts.address(0) + ":29400",
                                         "--nproc_per_node=1",
                                         kFastConf,
                                         kWorker,
                                         "rdzv"};
  auto first = start_on(hosts, 0, args);
  std::this_thread::sleep_for(1500ms);
  auto late = start_on(hosts, 1, args);
  auto r0 = first->wait(30s), r1 = late->wait(30s);
  ASSERT_EQ(r0.code, 0) << r0.err << r0.out;
  ASSERT_EQ(r1.code, 0) << r1.err << r1.out;
  // One round of two: the first host waited for the late one (MAX joined).
  EXPECT_NE(r0.err.find("round 1: 2 node(s), world size 2"), std::string::npos) << r0.err;
  EXPECT_EQ(ranks_ok(r0.out).size() + ranks_ok(r1.out).size(), 2u);
}

TEST_F(MultiHost, ScaleUpWhileRunningRestartsTheGroupWithoutUsingARestart) {
  NetnsHosts hosts(2);
  const std::vector<std::string> args = {"--nnodes=1:2",
                                         "--rdzv_endpoint=" + hosts.address(0) + ":29400",
                                         "--nproc_per_node=2",
                                         "--max_restarts=0",
                                         kFastConf + ",last_call_timeout=2",
                                         kWorker,
                                         "rdzv-at-size",
                                         "2"};
  auto first = start_on(hosts, 0, args);
  ASSERT_TRUE(wait_until(
      [&] { return first->read_out().find("holding in round 1") != std::string::npos; }, 20s))
      << first->read_err();
  auto second = start_on(hosts, 1, args);
  auto r0 = first->wait(30s), r1 = second->wait(30s);
  ASSERT_TRUE(r0.exited && r1.exited) << "host 0:\n" << r0.err << "\nhost 1:\n" << r1.err;
  ASSERT_EQ(r0.code, 0) << r0.err << r0.out;
  ASSERT_EQ(r1.code, 0) << r1.err << r1.out;
  EXPECT_NE(r0.err.find("round 2: 2 node(s), world size 4"), std::string::npos) << r0.err;
  EXPECT_NE(r0.err.find("scale-up"), std::string::npos) << r0.err;
  EXPECT_NE(r1.err.find("round 2: 2 node(s), world size 4"), std::string::npos) << r1.err;
  // The scale-up used no restart (--max_restarts=0 still allowed it).
  EXPECT_NE(r0.out.find("restart=0"), std::string::npos) << r0.out;
  EXPECT_EQ(ranks_ok(r0.out).size() + ranks_ok(r1.out).size(), 4u);
}

TEST_F(MultiHost, PartitionStopsBothSidesWithinHeartbeatTimeout) {
  NetnsHosts hosts(2);
  const std::string dir = make_temp_dir();
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i) {
    nodes.push_back(start_on(
        hosts, i,
        {"--nnodes=2", "--node_rank=" + std::to_string(i), "--master_addr=" + hosts.address(0),
         "--nproc_per_node=2", kFastConf, kWorker, "hold", dir}));
  }
  ASSERT_TRUE(wait_until([&] { return read_pids(dir, "pid_").size() == 4; }, 20s))
      << nodes[0]->read_err() << nodes[1]->read_err();
  hosts.set_link(1, false);
  const auto cut = std::chrono::steady_clock::now();
  for (int i = 0; i < 2; ++i) {
    auto r = nodes[i]->wait(20s);
    const double after =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
    ASSERT_TRUE(r.exited) << "host " << i << " still running: " << r.err;
    EXPECT_NE(r.code, 0) << r.err;
    EXPECT_LT(after, 2.0 + 2.0) << "host " << i << " took " << after << " s: " << r.err;
    // Each side names the loss: the host a silent node, the other the silent server.
    EXPECT_TRUE(r.err.find("stopped sending heartbeats") != std::string::npos ||
                r.err.find("lost the rendezvous server") != std::string::npos)
        << r.err;
  }
  // No worker, nor a worker's child, is left on either side.
  for (pid_t pid : read_pids(dir, "")) {
    EXPECT_TRUE(pid > 0 && wait_until([&] { return !process_alive(pid); }, 2s)) << "pid " << pid;
  }
  std::filesystem::remove_all(dir);
}

TEST_F(MultiHost, RelaunchedNodeRejoinsWithinTheRestartBudget) {
  NetnsHosts hosts(2);
  auto args = [&](int i) {
    return std::vector<std::string>{"--nnodes=2",
                                    "--node_rank=" + std::to_string(i),
                                    "--master_addr=" + hosts.address(0),
                                    "--max_restarts=3",
                                    "--nproc_per_node=1",
                                    kFastConf,
                                    kWorker,
                                    "rdzv-at-restart",
                                    "1"};
  };
  auto n0 = start_on(hosts, 0, args(0));
  auto n1 = start_on(hosts, 1, args(1));
  auto holding = [](Subprocess& p) {
    return p.read_out().find("holding in round 1") != std::string::npos;
  };
  ASSERT_TRUE(wait_until([&] { return holding(*n0) && holding(*n1); }, 20s))
      << n0->read_err() << n1->read_err();
  kill(n1->pid(), SIGKILL);  // the agent dies; a scheduler starts the same command again
  n1->wait(5s);
  std::this_thread::sleep_for(500ms);
  auto again = start_on(hosts, 1, args(1));
  auto r0 = n0->wait(30s), r1 = again->wait(30s);
  ASSERT_EQ(r0.code, 0) << r0.err << r0.out;
  ASSERT_EQ(r1.code, 0) << r1.err << r1.out;
  EXPECT_NE(r0.err.find("was relaunched"), std::string::npos) << r0.err;
  EXPECT_NE(r0.out.find("RDZV OK rank=0 world=2 group=0 round=2 restart=1"), std::string::npos)
      << r0.out;
  EXPECT_NE(r1.out.find("RDZV OK rank=1 world=2 group=1 round=2 restart=1"), std::string::npos)
      << r1.out;
}

TEST_F(MultiHost, AHostArrivingAtAFullRoundWaitsForAPlaceAndSaysSo) {
  NetnsHosts hosts(3);
  const std::vector<std::string> args = {"--nnodes=2", "--rdzv_backend=c10d",
                                         "--rdzv_endpoint=" + hosts.address(0) + ":29400",
                                         "--nproc_per_node=1", kFastConf};
  auto with = [&](std::vector<std::string> program) {
    auto all = args;
    all.insert(all.end(), program.begin(), program.end());
    return all;
  };
  std::vector<std::unique_ptr<Subprocess>> running;
  for (int i = 0; i < 2; ++i)
    running.push_back(start_on(hosts, i, with({"/bin/sh", "-c", "sleep 3"})));
  for (auto& n : running) {
    ASSERT_TRUE(
        wait_until([&] { return n->read_err().find("round 1:") != std::string::npos; }, 20s))
        << n->read_err();
  }
  auto late = start_on(hosts, 2, with({kWorker, "env"}));
  ASSERT_TRUE(wait_until(
      [&] { return late->read_err().find("waiting for a place") != std::string::npos; }, 10s))
      << late->read_err();
  EXPECT_NE(late->read_err().find("round 1 is full (2 nodes, --nnodes=2)"), std::string::npos)
      << late->read_err();
  for (auto& n : running) {
    auto r = n->wait(20s);
    EXPECT_EQ(r.code, 0) << r.err;
  }
  // The job is over: the host of the rendezvous stays until the late host has
  // asked again and heard so; it stops without running anything.
  auto r = late->wait(20s);
  ASSERT_TRUE(r.exited);
  EXPECT_NE(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("has already completed"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("ENV RANK="), std::string::npos) << "the late host ran workers:\n" << r.out;
}

// Two live hosts given one --node_rank (a copied command line): the second is
// told at once who holds the rank and waits; the running job is not disturbed
// (no round ends, no restart is used).
TEST_F(MultiHost, ASecondLiveHostClaimingANodeRankIsNamedAtOnceAndDisturbsNothing) {
  NetnsHosts hosts(3);
  auto args = [&](int node_rank, const std::string& program) {
    return std::vector<std::string>{"--nnodes=2",
                                    "--node_rank=" + std::to_string(node_rank),
                                    "--master_addr=" + hosts.address(0),
                                    "--max_restarts=3",
                                    "--nproc_per_node=1",
                                    kFastConf,
                                    "/bin/sh",
                                    "-c",
                                    program};
  };
  std::vector<std::unique_ptr<Subprocess>> running;
  for (int i = 0; i < 2; ++i) running.push_back(start_on(hosts, i, args(i, "sleep 3")));
  for (auto& n : running) {
    ASSERT_TRUE(
        wait_until([&] { return n->read_err().find("round 1:") != std::string::npos; }, 20s))
        << n->read_err();
  }
  auto twin = start_on(hosts, 2, args(1, "echo twin ran"));
  ASSERT_TRUE(wait_until(
      [&] { return twin->read_err().find("node rank 1 is held by host") != std::string::npos; },
      10s))
      << twin->read_err();
  EXPECT_NE(twin->read_err().find("which is alive"), std::string::npos) << twin->read_err();
  for (auto& n : running) {
    auto r = n->wait(20s);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.err.find("relaunched"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("round 2"), std::string::npos) << r.err;
  }
  auto r = twin->wait(20s);
  ASSERT_TRUE(r.exited);
  EXPECT_NE(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("twin ran"), std::string::npos) << r.out;
}

TEST_F(MultiHost, SigtermDuringAJoinEndsDdprunAtOnce) {
  NetnsHosts hosts(2);
  // Host 1 waits for a rendezvous host that never comes up.
  auto lonely = start_on(hosts, 1,
                         {"--nnodes=2", "--node_rank=1", "--master_addr=" + hosts.address(0),
                          "--nproc_per_node=1", kFastConf, kWorker, "rdzv"});
  std::this_thread::sleep_for(1s);
  kill(lonely->pid(), SIGTERM);
  auto r = lonely->wait(5s);
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.code, 128 + SIGTERM) << r.err;
  EXPECT_LT(r.seconds, 1.0 + 1.0 + 0.5) << r.err;  // 1 s before the signal, answered within 1 s
  EXPECT_NE(r.err.find("SIGTERM while waiting for the rendezvous at " + hosts.address(0)),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace ddp::testing
