// Multi-node jobs on loopback: several ddprun agents as separate nodes, the
// rendezvous in node 0's agent or in a standalone `ddprun rendezvous`.

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "multinode_harness.h"
#include "rdzv_output.h"
#include "subprocess.h"
#include "test_pki.h"

namespace ddp::testing {
namespace {

using namespace multinode_test;

// A standalone `ddprun rendezvous` on an ephemeral port; returns its port.
struct Daemon {
  std::unique_ptr<Subprocess> process;
  int port = 0;
  // `wrapper` runs before ddprun (e.g. prlimit to give it a low open-file limit).
  Daemon(int nnodes, std::vector<std::string> extra = {}, std::vector<std::string> wrapper = {}) {
    std::vector<std::string> args = wrapper;
    args.insert(args.end(),
                {kDdprun, "rendezvous", "--port=0", "--host=127.0.0.1", "--run_id=mn",
                 "--nnodes=" + std::to_string(nnodes),
                 "--rdzv_conf=heartbeat_interval=0.2,heartbeat_timeout=2,join_timeout=20"});
    args.insert(args.end(), extra.begin(), extra.end());
    process = std::make_unique<Subprocess>(args, kToken);
    wait_until([&] { return process->read_out().find("listening on") != std::string::npos; }, 10s);
    auto out = process->read_out();
    auto colon = out.rfind(':');
    if (colon != std::string::npos) port = std::stoi(out.substr(colon + 1));
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port); }
};

TEST(MultiNode, TwoNodesGetGlobalRanksAndShareStoreAndBarriers) {
  std::string ep = "127.0.0.1:" + std::to_string(free_port());
  auto n0 = agent(ep, 2, 0, 2, {kWorker, "rdzv"});
  auto n1 = agent(ep, 2, 1, 3, {kWorker, "rdzv"});
  auto r0 = n0->wait(60s), r1 = n1->wait(60s);
  ASSERT_EQ(r0.code, 0) << r0.err << r0.out;
  ASSERT_EQ(r1.code, 0) << r1.err << r1.out;
  EXPECT_EQ(ranks_ok(r0.out), (std::set<int>{0, 1}));
  EXPECT_EQ(ranks_ok(r1.out), (std::set<int>{2, 3, 4}));
  EXPECT_NE(r1.out.find("world=5 group=1"), std::string::npos) << r1.out;
}

TEST(MultiNode, ThreeNodesWithStandaloneDaemonAndAutomaticRanks) {
  Daemon daemon(3);
  ASSERT_GT(daemon.port, 0) << daemon.process->read_err();
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 3; ++i)
    nodes.push_back(agent(daemon.endpoint(), 3, -1, 2, {kWorker, "rdzv"}));
  std::set<int> all;
  for (auto& n : nodes) {
    auto r = n->wait(60s);
    ASSERT_EQ(r.code, 0) << r.err << r.out;
    auto ranks = ranks_ok(r.out);
    EXPECT_EQ(ranks.size(), 2u) << r.out;
    all.insert(ranks.begin(), ranks.end());
  }
  EXPECT_EQ(all, (std::set<int>{0, 1, 2, 3, 4, 5}));
  auto d = daemon.process->wait(15s);
  EXPECT_TRUE(d.exited);
  EXPECT_EQ(d.code, 0) << d.err;  // the daemon exits once the job succeeded
}

TEST(MultiNode, AWorkerFailureOnOneNodeStopsEveryNode) {
  std::string ep = "127.0.0.1:" + std::to_string(free_port());
  auto dir = make_temp_dir();
  auto n0 = agent(ep, 2, 0, 2, {kWorker, "hold", dir});
  auto n1 = agent(ep, 2, 1, 2, {kWorker, "fail", "3", "9"}, {"--shutdown_timeout=1"});
  auto r1 = n1->wait(30s);
  auto r0 = n0->wait(30s);
  EXPECT_EQ(r1.code, 9) << r1.err;
  EXPECT_NE(r1.err.find("rank 3 (local rank 1"), std::string::npos) << r1.err;
  EXPECT_EQ(r0.code, 1) << r0.err;
  EXPECT_NE(r0.err.find("ended on another node"), std::string::npos) << r0.err;
  EXPECT_NE(r0.err.find("rank 3"), std::string::npos) << r0.err;  // the first failure's report
}

TEST(MultiNode, SigkillOfOneAgentStopsTheOthersWithinHeartbeatTimeout) {
  std::string ep = "127.0.0.1:" + std::to_string(free_port());
  auto dir0 = make_temp_dir(), dir1 = make_temp_dir();
  auto n0 = agent(ep, 2, 0, 1, {kWorker, "hold", dir0});
  auto n1 = agent(ep, 2, 1, 1, {kWorker, "hold", dir1});
  auto has_pid = [](const std::string& dir) {
    return !read_file(dir + "/pid_0").empty() || !read_file(dir + "/pid_1").empty();
  };
  ASSERT_TRUE(wait_until([&] { return has_pid(dir0) && has_pid(dir1); }, 20s));
  auto start = std::chrono::steady_clock::now();
  kill(n1->pid(), SIGKILL);
  auto r0 = n0->wait(20s);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(r0.exited);
  EXPECT_EQ(r0.code, 1) << r0.err;
  EXPECT_LT(seconds, 2.0 + 2.0) << r0.err;  // heartbeat_timeout + 2 s
  EXPECT_NE(r0.err.find("node 1"), std::string::npos) << r0.err;
  EXPECT_NE(r0.err.find("heartbeat"), std::string::npos) << r0.err;
  pid_t orphan = std::stoi(read_file(dir1 + "/pid_1"));
  EXPECT_TRUE(wait_until([&] { return !process_alive(orphan); }, 5s));
}

TEST(MultiNode, RestartRoundGivesFreshRoundAndRestartCount) {
  std::string ep = "127.0.0.1:" + std::to_string(free_port());
  auto n0 = agent(ep, 2, 0, 1, {kWorker, "rdzv"}, {"--max_restarts=2"});
  // Node 1's worker fails in the first round only: a script around the test worker.
  auto n1 = agent(
      ep, 2, 1, 1,
      {"sh", "-c",
       "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then exit 4; fi; exec " + kWorker + " rdzv"},
      {"--max_restarts=2"});
  auto r1 = n1->wait(60s), r0 = n0->wait(60s);
  ASSERT_EQ(r1.code, 0) << r1.err << r1.out;
  ASSERT_EQ(r0.code, 0) << r0.err << r0.out;
  EXPECT_NE(r0.out.find("RDZV OK rank=0 world=2 group=0 round=2 restart=1"), std::string::npos)
      << r0.out;
  EXPECT_NE(r1.out.find("RDZV OK rank=1 world=2 group=1 round=2 restart=1"), std::string::npos)
      << r1.out;
}

TEST(MultiNode, RestartBudgetIsJobWide) {
  std::string ep = "127.0.0.1:" + std::to_string(free_port());
  // Both nodes fail every round: one restart is allowed for the whole job, not one per node.
  auto n0 = agent(ep, 2, 0, 1, {"sh", "-c", "echo attempt $TORCHELASTIC_RESTART_COUNT; exit 3"},
                  {"--max_restarts=1"});
  auto n1 = agent(ep, 2, 1, 1, {"sh", "-c", "echo attempt $TORCHELASTIC_RESTART_COUNT; exit 3"},
                  {"--max_restarts=1"});
  auto r0 = n0->wait(60s), r1 = n1->wait(60s);
  EXPECT_NE(r0.code, 0);
  EXPECT_NE(r1.code, 0);
  std::string all = r0.out + r1.out;
  EXPECT_NE(all.find("attempt 1"), std::string::npos) << all;
  EXPECT_EQ(all.find("attempt 2"), std::string::npos) << all;
}

TEST(MultiNode, Ipv6Loopback) {
  int port = free_port(AF_INET6);
  if (port < 0) GTEST_SKIP() << "::1 cannot be bound on this machine";
  std::string ep = "[::1]:" + std::to_string(port);
  auto n0 = agent(ep, 2, 0, 1, {kWorker, "rdzv"});
  auto n1 = agent(ep, 2, 1, 1, {kWorker, "rdzv"});
  auto r0 = n0->wait(60s), r1 = n1->wait(60s);
  EXPECT_EQ(r0.code, 0) << r0.err;
  EXPECT_EQ(r1.code, 0) << r1.err;
  EXPECT_EQ(ranks_ok(r0.out + r1.out), (std::set<int>{0, 1}));
}

TEST(MultiNode, TlsRendezvousWithCaOnEveryNode) {
  const auto& pki = test_pki();
  if (!pki.error.empty()) GTEST_SKIP() << pki.error;
  // The certificate names localhost, so the endpoint does too.
  std::string ep = "localhost:" + std::to_string(free_port());
  auto n0 = agent(
      ep, 2, 0, 1, {kWorker, "rdzv"},
      {"--rdzv_tls_cert=" + pki.cert, "--rdzv_tls_key=" + pki.key, "--rdzv_tls_ca=" + pki.ca});
  auto n1 = agent(ep, 2, 1, 1, {kWorker, "rdzv"}, {"--rdzv_tls_ca=" + pki.ca});
  auto r0 = n0->wait(60s), r1 = n1->wait(60s);
  EXPECT_EQ(r0.code, 0) << r0.err;
  EXPECT_EQ(r1.code, 0) << r1.err;
  EXPECT_EQ(ranks_ok(r0.out + r1.out), (std::set<int>{0, 1}));
  // A node that trusts another CA cannot join.
  auto dir = make_temp_dir();
  auto host = agent(
      ep, 2, 0, 1, {kWorker, "hold", dir},
      {"--rdzv_tls_cert=" + pki.cert, "--rdzv_tls_key=" + pki.key, "--rdzv_conf=join_timeout=2"});
  auto stranger = agent(ep, 2, 1, 1, {kWorker, "env"},
                        {"--rdzv_tls_ca=" + pki.other_ca, "--rdzv_conf=join_timeout=1"});
  auto rs = stranger->wait(20s);
  EXPECT_EQ(rs.code, 1) << rs.err;
  auto rh = host->wait(20s);
  EXPECT_NE(rh.code, 0) << rh.err;  // its round never formed: join timeout
}

TEST(MultiNode, ElasticRoundClosesAfterLastCallWithMinNodes) {
  std::string ep = "127.0.0.1:" + std::to_string(free_port());
  auto n0 = agent(ep, 2, 0, 2, {kWorker, "rdzv"},
                  {"--nnodes=1:2", "--rdzv_conf=last_call_timeout=0.3,join_timeout=20"});
  auto r = n0->wait(30s);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(ranks_ok(r.out), (std::set<int>{0, 1}));
}

// torchrun reads --rdzv_conf timeout only in its static rendezvous: with
// c10d a late node still gets the last call, and a value it does not read
// is not parsed (a quoted list passed on with its quotes included).
TEST(MultiNode, RdzvConfTimeoutIsTheJoinTimeoutOfTheStaticFormOnlyAsUnderTorchrun) {
  std::string ep = "127.0.0.1:" + std::to_string(free_port());
  auto c10d = agent(ep, 2, -1, 1, {kWorker, "rdzv"},
                    {"--nnodes=1:2", "--rdzv_backend=c10d",
                     "--rdzv_conf=join_timeout=20,last_call_timeout=3,timeout=1"});
  auto r = c10d->wait(30s);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_GE(r.seconds, 3.0) << "the round closes after its last call";
  EXPECT_NE(r.err.find("--rdzv_conf timeout=1 has no effect"), std::string::npos) << r.err;

  auto quoted = agent("127.0.0.1:" + std::to_string(free_port()), 2, -1, 1, {kWorker, "rdzv"},
                      {"--nnodes=1:2", "--rdzv_backend=c10d",
                       "--rdzv_conf='join_timeout=5,last_call_timeout=1,timeout=5'"});
  r = quoted->wait(30s);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("a quote is left in it"), std::string::npos) << r.err;

  auto one_node = run_process({kDdprun, "--nproc-per-node=1", "--rdzv_conf=timeout=x",
                               "--no-python", kWorker, "exit", "0"});
  EXPECT_EQ(one_node.code, 0) << one_node.err;

  // The static form's join timeout: node rank 1 never comes.
  auto alone = agent("127.0.0.1:" + std::to_string(free_port()), 2, 0, 1, {kWorker, "rdzv"},
                     {"--rdzv_backend=static", "--rdzv_conf=timeout=1"});
  r = alone->wait(30s);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("join timed out after 1.0s"), std::string::npos) << r.err;
}

// The join timeout bounds the last call too. On the node that hosts the
// rendezvous the error says what happened there, not that a server (this
// process) may be down.
TEST(MultiNode, AJoinTimeoutDuringTheLastCallSaysWhatArrivedAndWhichKeySetsIt) {
  std::string ep = "127.0.0.1:" + std::to_string(free_port());
  auto host = agent(
      ep, 2, -1, 1, {kWorker, "rdzv"},
      {"--nnodes=1:2", "--rdzv_backend=c10d", "--rdzv_conf=join_timeout=1,last_call_timeout=30"});
  auto r = host->wait(30s);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_LT(r.seconds, 10.0) << r.err;
  EXPECT_EQ(r.err.find("is the server running"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rendezvous join timed out after 1.0s (--rdzv_conf join_timeout"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("1 of at most 2 nodes joined (--nnodes=1:2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(--rdzv_conf last_call_timeout)"), std::string::npos) << r.err;
}

TEST(MultiNode, HealthOfLiveAndStoppedServers) {
  Daemon daemon(2);
  ASSERT_GT(daemon.port, 0);
  auto live = run_process({kDdprun, "health", daemon.endpoint()});
  EXPECT_EQ(live.code, 0) << live.err;
  EXPECT_EQ(live.out, "SERVING\n");
  kill(daemon.process->pid(), SIGTERM);
  auto stopped_daemon = daemon.process->wait(10s);
  EXPECT_EQ(stopped_daemon.code, 0) << stopped_daemon.err;
  auto dead = run_process({kDdprun, "health", "--timeout=1", daemon.endpoint()});
  EXPECT_EQ(dead.code, 1);
  EXPECT_EQ(dead.out, "UNAVAILABLE\n");
  auto bad = run_process({kDdprun, "health", "not a [endpoint"});
  EXPECT_EQ(bad.code, 2);
}

// Anyone who can reach the port can open connections until the server has no
// descriptor left; once they close, the server must accept again (gRPC's own
// acceptor stops for good after EMFILE).
TEST(MultiNode, ServerAcceptsAgainAfterConnectionsUsedUpItsDescriptors) {
  Daemon daemon(2, {}, {"prlimit", "--nofile=64:64"});
  ASSERT_GT(daemon.port, 0) << daemon.process->read_err();
  std::vector<int> held;
  for (int i = 0; i < 100; ++i) {
    if (int fd = connect_loopback(daemon.port); fd >= 0) held.push_back(fd);
  }
  EXPECT_GT(held.size(), 64u) << "the listen backlog took fewer connections than the limit";
  std::this_thread::sleep_for(500ms);  // the server has met its limit by now
  for (int fd : held) close(fd);
  // Serving again within a few seconds of the connections closing.
  bool serving = wait_until(
      [&] {
        return run_process({kDdprun, "health", "--timeout=1", daemon.endpoint()}).out ==
               "SERVING\n";
      },
      10s);
  EXPECT_TRUE(serving) << daemon.process->read_err();
  auto n0 = agent(daemon.endpoint(), 2, -1, 1, {kWorker, "rdzv"});
  auto n1 = agent(daemon.endpoint(), 2, -1, 1, {kWorker, "rdzv"});
  auto r0 = n0->wait(30s), r1 = n1->wait(30s);
  EXPECT_EQ(r0.code, 0) << r0.err;
  EXPECT_EQ(r1.code, 0) << r1.err;
  EXPECT_TRUE(process_alive(daemon.process->pid()));
}

TEST(MultiNode, WrongTokenIsRefusedAndNothingRuns) {
  Daemon daemon(1);
  ASSERT_GT(daemon.port, 0);
  auto dir = make_temp_dir();
  auto intruder =
      agent(daemon.endpoint(), 2, -1, 1, {kWorker, "hold", dir}, {}, {{"DDP_RDZV_TOKEN", "wrong"}});
  auto r = intruder->wait(20s);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("UNAUTHENTICATED"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir + "/pid_0"));
}

TEST(MultiNode, UnreachableEndpointFailsAfterJoinTimeout) {
  std::string ep = "127.0.0.1:" + std::to_string(free_port());  // nobody listens
  auto n1 = agent(ep, 2, 1, 1, {kWorker, "env"}, {"--rdzv_conf=join_timeout=1"});
  auto r = n1->wait(20s);
  EXPECT_EQ(r.code, 1);
  EXPECT_LT(r.seconds, 6.0);
  EXPECT_NE(r.err.find(ep), std::string::npos) << r.err;
}

TEST(MultiNode, ServerDyingMidJobStopsTheAgents) {
  Daemon daemon(2);
  ASSERT_GT(daemon.port, 0);
  auto dir = make_temp_dir();
  auto n0 = agent(daemon.endpoint(), 2, -1, 1, {kWorker, "hold", dir});
  auto n1 = agent(daemon.endpoint(), 2, -1, 1, {kWorker, "hold", dir});
  ASSERT_TRUE(wait_until(
      [&] {
        return std::filesystem::exists(dir + "/pid_0") && std::filesystem::exists(dir + "/pid_1");
      },
      20s));
  kill(daemon.process->pid(), SIGKILL);
  auto r0 = n0->wait(20s), r1 = n1->wait(20s);
  EXPECT_EQ(r0.code, 1) << r0.err;
  EXPECT_EQ(r1.code, 1) << r1.err;
  EXPECT_NE(r0.err.find("lost the rendezvous server"), std::string::npos) << r0.err;
  EXPECT_LT(r0.seconds, 15.0);
}

TEST(MultiNode, BusyRendezvousPortIsAnError) {
  BusyPort busy;
  ASSERT_GT(busy.port(), 0);
  std::string ep = "127.0.0.1:" + std::to_string(busy.port());
  auto n0 = agent(ep, 2, 0, 1, {kWorker, "env"});
  auto r = n0->wait(20s);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--rdzv_endpoint=" + ep), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("in use"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1)
      << "one error line, no gRPC log noise: " << r.err;
}

// The standalone server reads --nnodes as the launcher does (one parser).
TEST(MultiNode, TheStandaloneServerRefusesAMalformedNnodesAsTheLauncherDoes) {
  for (const std::string bad : {"2x", "0", "3:2", "a:b"}) {
    auto server = run_process(
        {kDdprun, "rendezvous", "--port=0", "--host=127.0.0.1", "--run_id=x", "--nnodes=" + bad},
        kToken, 10s);
    auto launcher = run_process(
        {kDdprun, "--nnodes=" + bad, "--rdzv_endpoint=127.0.0.1:1", kWorker, "env"}, kToken, 10s);
    EXPECT_NE(server.code, 0) << bad << ": " << server.out;
    EXPECT_NE(server.err.find("--nnodes=" + bad), std::string::npos) << server.err;
    const std::string server_error = server.err.substr(server.err.find("--nnodes="));
    EXPECT_NE(launcher.err.find(server_error.substr(0, server_error.find('\n'))), std::string::npos)
        << "the two errors differ:\n"
        << server.err << launcher.err;
  }
}

TEST(MultiNode, MultiNodeNeedsAnEndpointOrAStaticNodeRank) {
  auto no_ep = run_process({kDdprun, "--nnodes=2", kWorker, "env"}, kToken);
  EXPECT_EQ(no_ep.code, 2);
  EXPECT_NE(no_ep.err.find("--rdzv_endpoint"), std::string::npos) << no_ep.err;
  auto static_without_rank =
      run_process({kDdprun, "--nnodes=2", "--rdzv_backend=static", kWorker, "env"}, kToken);
  EXPECT_EQ(static_without_rank.code, 2);
  EXPECT_NE(static_without_rank.err.find("needs --node_rank"), std::string::npos)
      << static_without_rank.err;
  auto etcd = run_process({kDdprun, "--nnodes=2", "--rdzv_backend=etcd-v2",
                           "--rdzv_endpoint=127.0.0.1:2379", kWorker, "env"},
                          kToken);
  EXPECT_EQ(etcd.code, 2);
  EXPECT_NE(etcd.err.find("--rdzv_backend=etcd-v2 is not supported"), std::string::npos)
      << etcd.err;
  EXPECT_NE(etcd.err.find("c10d"), std::string::npos) << etcd.err;
}

TEST(MultiNode, WithoutATokenTheJobRunsUnauthenticatedAndSaysSo) {
  std::string ep = "127.0.0.1:" + std::to_string(free_port());
  const std::map<std::string, std::string> no_token = {{"DDP_RDZV_TOKEN", "\x01"}};
  auto n0 = agent(ep, 2, 0, 1, {kWorker, "rdzv"}, {}, no_token);
  auto n1 = agent(ep, 2, 1, 1, {kWorker, "rdzv"}, {}, no_token);
  auto r0 = n0->wait(30s), r1 = n1->wait(30s);
  ASSERT_EQ(r0.code, 0) << r0.err;
  ASSERT_EQ(r1.code, 0) << r1.err;
  EXPECT_NE(r0.err.find("is unauthenticated"), std::string::npos) << r0.err;
  EXPECT_NE(r0.err.find("DDP_RDZV_TOKEN"), std::string::npos) << r0.err;
  EXPECT_EQ(ranks_ok(r0.out).size() + ranks_ok(r1.out).size(), 2u);
}

// Node 0 hosts (its own join follows the line at once).
void wait_hosting(Subprocess& node) {
  ASSERT_TRUE(wait_until(
      [&] { return node.read_err().find("hosting the rendezvous") != std::string::npos; }, 10s))
      << node.read_err();
  std::this_thread::sleep_for(300ms);
}

TEST(MultiNode, ATokenOnOneNodeOnlyFailsBothAtOnce) {
  std::string ep = "127.0.0.1:" + std::to_string(free_port());
  // Node 0 hosts without a token; node 1 has one: both hear it within seconds.
  auto n0 = agent(ep, 2, 0, 1, {kWorker, "rdzv"}, {}, {{"DDP_RDZV_TOKEN", "\x01"}});
  wait_hosting(*n0);
  auto n1 = agent(ep, 2, 1, 1, {kWorker, "rdzv"});
  auto r0 = n0->wait(15s), r1 = n1->wait(15s);
  ASSERT_TRUE(r0.exited && r1.exited) << r0.err << r1.err;
  EXPECT_EQ(r0.code, 1) << r0.err;
  EXPECT_EQ(r1.code, 1) << r1.err;
  EXPECT_NE(r1.err.find("runs without one"), std::string::npos) << r1.err;
  EXPECT_NE(r0.err.find("was refused"), std::string::npos) << r0.err;
  EXPECT_LT(r0.seconds, 10.0);
}

TEST(MultiNode, TwoNodesWithOneRankFailBothAtOnce) {
  std::string ep = "127.0.0.1:" + std::to_string(free_port());
  auto n0 = agent(ep, 3, 0, 1, {kWorker, "rdzv"});
  wait_hosting(*n0);
  auto a = agent(ep, 3, 1, 1, {kWorker, "rdzv"});
  auto b = agent(ep, 3, 1, 1, {kWorker, "rdzv"});
  for (auto* n : {n0.get(), a.get(), b.get()}) {
    auto r = n->wait(15s);
    ASSERT_TRUE(r.exited) << r.err;
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find("node rank 1 was given to two nodes"), std::string::npos) << r.err;
  }
}

TEST(MultiNode, RunIdThatDiffersBetweenNodesFailsBothAtOnce) {
  std::string ep = "127.0.0.1:" + std::to_string(free_port());
  auto n0 = agent(ep, 2, 0, 1, {kWorker, "rdzv"}, {}, kToken, "job-a");
  wait_hosting(*n0);
  auto n1 = agent(ep, 2, 1, 1, {kWorker, "rdzv"}, {}, kToken, "job-b");
  auto r0 = n0->wait(15s), r1 = n1->wait(15s);
  ASSERT_TRUE(r0.exited && r1.exited) << r0.err << r1.err;
  EXPECT_EQ(r0.code, 1);
  EXPECT_EQ(r1.code, 1);
  EXPECT_NE(r1.err.find("run id 'job-b' does not match this server's run 'job-a'"),
            std::string::npos)
      << r1.err;
  EXPECT_NE(r0.err.find("run id 'job-b'"), std::string::npos) << r0.err;
}

TEST(MultiNode, SameC10dCommandOnOneMachineFindsOneHost) {
  // Every agent is on the endpoint's machine: the first to listen hosts, the
  // others become clients (torchrun's rule), with assigned ranks.
  std::string ep = "127.0.0.1:" + std::to_string(free_port());
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i) {
    nodes.push_back(std::make_unique<Subprocess>(
        std::vector<std::string>{kDdprun, "--nnodes=2", "--rdzv_backend=c10d",
                                 "--rdzv_endpoint=" + ep, "--rdzv_id=same", "--nproc_per_node=1",
                                 kFastConf, kWorker, "rdzv"},
        kToken));
  }
  int hosting = 0;
  std::set<int> all;
  for (auto& n : nodes) {
    auto r = n->wait(30s);
    ASSERT_EQ(r.code, 0) << r.err;
    hosting += r.err.find("hosting the rendezvous") != std::string::npos;
    auto ranks = ranks_ok(r.out);
    all.insert(ranks.begin(), ranks.end());
  }
  EXPECT_EQ(hosting, 1);
  EXPECT_EQ(all, (std::set<int>{0, 1}));
}

TEST(MultiNode, SignalsDuringAJoinEndDdprunWithinASecond) {
  for (int sig : {SIGTERM, SIGINT}) {
    // Node 0 hosts and waits for a node that never comes.
    std::string ep = "127.0.0.1:" + std::to_string(free_port());
    auto n0 = agent(ep, 2, 0, 1, {kWorker, "rdzv"});
    ASSERT_TRUE(wait_until(
        [&] { return n0->read_err().find("hosting the rendezvous") != std::string::npos; }, 10s));
    const auto sent = std::chrono::steady_clock::now();
    kill(n0->pid(), sig);
    auto r = n0->wait(5s);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
    ASSERT_TRUE(r.exited);
    EXPECT_EQ(r.code, 128 + sig) << r.err;
    EXPECT_LT(took, 1.0) << r.err;
    // What it waited for depends on whether its channel had connected yet.
    EXPECT_NE(r.err.find(std::string("received ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT") +
                         " while waiting for "),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("left the rendezvous"), std::string::npos) << r.err;
  }
}

TEST(MultiNode, ANodeWaitingForAnUnreachableServerSaysSoAndStopsOnSigterm) {
  std::string ep = "127.0.0.1:" + std::to_string(free_port());  // nobody listens
  auto n1 = agent(ep, 2, 1, 1, {kWorker, "env"});
  ASSERT_TRUE(wait_until(
      [&] { return n1->read_err().find("is not reachable yet") != std::string::npos; }, 15s))
      << n1->read_err();
  EXPECT_NE(n1->read_err().find("the rendezvous at " + ep +
                                " is not reachable yet; retrying until the join timeout"),
            std::string::npos)
      << n1->read_err();
  kill(n1->pid(), SIGTERM);
  auto r = n1->wait(5s);
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.code, 128 + SIGTERM) << r.err;
  EXPECT_NE(r.err.find("received SIGTERM while waiting for the rendezvous at " + ep +
                       " to become reachable"),
            std::string::npos)
      << r.err;
}

TEST(MultiNode, TorchrunFlagsWithoutEffectAreAcceptedWithANotice) {
  auto r = run_process({kDdprun, "--start_method=spawn", "--logs-specs=x", "--run_path",
                        "--nproc_per_node=1", kWorker, "exit", "0"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("--start_method=spawn has no effect"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--logs_specs=x has no effect"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--run_path has no effect"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ddp::testing
