// Live recovery across machines: namespace test hosts, each running ddprun
// --on_failure=heal with the reference trainer (heal_fault_worker): a rank
// killed on the second host, a whole host lost (with and without a sharded
// optimizer; with the rendezvous on a machine apart, the host of rank 0), a
// spare host taking a lost one's place, a host joining a running round, and
// hosts that share /dev/shm but not pids.

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "ddp/common/shm_names.h"
#include "heal_run.h"
#include "netns_hosts.h"
#include "netns_test.h"
#include "shm_segments.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;

class HealMultiHost : public NetnsTest {};

// ddprun's flags for namespace hosts that find each other through a c10d
// rendezvous on the first, with fast liveness (a host lost in 2 s).
std::vector<std::string> hosts_launcher(const NetnsHosts& hosts, const std::string& nnodes,
                                        const std::string& run_id,
                                        const std::string& more_conf = "") {
  return {"--nnodes=" + nnodes, "--rdzv_backend=c10d",
          "--rdzv_endpoint=" + hosts.address(0) + ":29400", "--rdzv_id=" + run_id,
          "--rdzv_conf=heartbeat_interval=0.2,heartbeat_timeout=2,join_timeout=20" + more_conf};
}

TEST_F(HealMultiHost, ARankKilledOnTheSecondHostIsReplacedAndEveryHostGoesOn) {
  NetnsHosts hosts(2);
  const std::string dir = make_temp_dir();
  const auto launcher = hosts_launcher(hosts, "2", "heal2");
  // The model is small: stripes of 1 KiB, so that it is striped all the same.
  std::map<std::string, std::string> env = kEnv;
  env["DDP_HEAL_STRIPE_MB"] = "0.001";
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int h = 0; h < 2; ++h) {
    nodes.push_back(std::make_unique<Subprocess>(
        hosts.on(h, heal_argv(2, launcher, {"--kill", "3@150"}, train_args(dir, 2500))), env));
  }
  const HealRun run = gather(nodes, dir, 120s);
  expect_healed(run, 4, 2500);
  EXPECT_TRUE(dropped(run.result.out, 3)) << run.result.out;
  // The group spans two hosts: the three holders each sent a share of the
  // state to the relaunch (the checksums above show the shares fit).
  EXPECT_NE(run.result.out.find("MB from ranks 0 1 2 (striped)"), std::string::npos)
      << run.result.out;
  EXPECT_NE(
      run.result.err.find("rank 3 (local rank 1) exited with signal 9 (SIGKILL): relaunching"),
      std::string::npos)
      << run.result.err;
}

// `argv` run as on a machine of its own in full (namespace hosts share one
// kernel): the other hosts cannot look up its pids, which would tell them
// its ranks died, and it has a /dev/shm of its own, where no pid of theirs
// is alive.
std::vector<std::string> as_own_machine(std::vector<std::string> argv) {
  argv.insert(argv.begin(), {"unshare", "--pid", "--fork", "--mount-proc", "sh", "-c",
                             "mount -t tmpfs tmpfs /dev/shm && exec \"$0\" \"$@\""});
  return argv;
}

// `argv` run as in a container that shares this machine's /dev/shm (the
// host's IPC namespace) but has its own pids: it runs until `trigger` (a
// file) exists, then its ddprun is SIGKILLed, and the command ends once its
// orphan guard has killed the workers and swept the run's files.
std::vector<std::string> in_container_whose_ddprun_dies(std::vector<std::string> argv,
                                                        const std::string& trigger) {
  const std::string script =
      "\"$0\" \"$@\" & p=$!; "
      "while [ ! -e " +
      trigger +
      " ] && kill -0 $p 2>/dev/null; do sleep 0.05; done; "
      "kill -9 $p; wait $p; while pgrep -x ddprun-guard >/dev/null; do sleep 0.05; done";
  argv.insert(argv.begin(), {"unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", script});
  return argv;
}

// How a host is lost: its processes are SIGKILLed (their connections
// close), or the machine dies with its link (nothing it had open closes).
enum class Loss { kProcesses, kWithItsLink };

// A whole host lost mid-run: two hosts of 2 ranks train with `args` and
// host 1 is lost; the rendezvous (on host 0) leaves the node out of the
// running round (--nnodes=1:2 allows one node), the survivors drop the lost
// ranks and finish the run on their own, losing no committed step or
// sample. `out`, `err`: host 0's output. `env`: beside kEnv.
void lose_a_whole_host(const std::function<std::vector<std::string>(const std::string&)>& args,
                       std::string& out, Loss loss = Loss::kProcesses,
                       const std::map<std::string, std::string>& more_env = {{"DDP_HEAL_WAIT_S",
                                                                              "2"}},
                       std::string* err = nullptr) {
  NetnsHosts hosts(2);
  const std::string dir = make_temp_dir();
  const auto launcher = hosts_launcher(hosts, "1:2", "heal-lost");
  std::map<std::string, std::string> env = kEnv;
  for (const auto& [k, v] : more_env) env[k] = v;
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int h = 0; h < 2; ++h) {
    std::vector<std::string> argv = heal_argv(2, launcher, {}, args(dir));
    if (loss == Loss::kWithItsLink && h == 1) argv = as_own_machine(argv);
    nodes.push_back(std::make_unique<Subprocess>(hosts.on(h, argv), env));
  }
  // Both hosts train (rank 0 has logged its first steps), then host 1 is lost.
  ASSERT_TRUE(
      wait_until([&] { return nodes[0]->read_out().find("step ") != std::string::npos; }, 60s))
      << nodes[0]->read_out() << nodes[0]->read_err();
  const auto cut = std::chrono::steady_clock::now();
  if (loss == Loss::kWithItsLink) hosts.set_link(1, false);
  hosts.kill_everything_on(1);
  const ProcessResult lost = nodes[1]->wait(10s);
  ASSERT_TRUE(lost.exited);
  EXPECT_TRUE(lost.signaled);
  if (loss == Loss::kWithItsLink) {  // for the reader: how long the survivors waited on it
    const bool failed = wait_until(
        [&] { return nodes[0]->read_err().find("did not commit") != std::string::npos; }, 90s);
    std::printf("the survivors' step failed %.1f s after the link went down\n",
                failed
                    ? std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count()
                    : -1.0);
  }

  HealRun run{nodes[0]->wait(120s), dir};
  expect_healed(run, 2, 4000);
  EXPECT_TRUE(dropped(run.result.out, 2) && dropped(run.result.out, 3)) << run.result.out;
  EXPECT_NE(run.result.err.find("stopped sending heartbeats"), std::string::npos) << run.result.err;
  EXPECT_NE(run.result.err.find("left out of round 1 (--on_failure=heal); 1 node(s) go on"),
            std::string::npos)
      << run.result.err;
  EXPECT_EQ(run.result.err.find("restarting the worker group"), std::string::npos)
      << run.result.err;
  EXPECT_EQ(run.result.err.find("joining the next round"), std::string::npos) << run.result.err;
  out = run.result.out;
  if (err) *err = run.result.err;
}

TEST_F(HealMultiHost, AWholeHostLostMidRunIsLeftOutAndTheOtherHostFinishes) {
  std::string out;
  lose_a_whole_host([](const std::string& dir) { return train_args(dir, 4000); }, out);
}

// A machine that dies with its link closes no connection, so no transport
// sees its ranks go; the rendezvous leaves its node out once its heartbeats
// stop (2 s here), and that is what fails the survivors' collective in
// flight and closes their next epoch: not their group's timeout, nor
// HealOptions::wait, both a minute here.
TEST_F(HealMultiHost, AHostThatDiesWithItsLinkIsDroppedAtTheHeartbeatTimeoutNotTheGroupTimeout) {
  std::string out, err;
  lose_a_whole_host([](const std::string& dir) { return train_args(dir, 4000); }, out,
                    Loss::kWithItsLink, {{"DDP_TIMEOUT_S", "60"}, {"DDP_HEAL_WAIT_S", "60"}}, &err);
  EXPECT_NE(err.find("did not commit: "), std::string::npos) << err;
  EXPECT_NE(err.find("node 1 was left out by the rendezvous (node 1 (host "), std::string::npos)
      << err;
  // Named at once, not after the failure report's few seconds of waiting for them.
  for (const char* rank : {"2", "3"}) {
    EXPECT_NE(err.find(std::string(rank) + " (its node 1 was left out by the rendezvous)"),
              std::string::npos)
        << err;
  }
  std::smatch waited;
  ASSERT_TRUE(std::regex_search(out, waited, std::regex("survivors waited ([0-9.]+) ms"))) << out;
  EXPECT_LT(std::stod(waited[1]), 30000.0) << out;
}

// One rank per machine, and the machines cannot look up each other's pids:
// rank 1 is killed, and its node's ddprun, which sees it exit, says so in
// the rendezvous's store. So the survivor names it dead at once (instead of
// waiting out the few seconds a failure report waits for ranks it cannot
// check) and goes on alone, instead of waiting for the relaunch (4 s late
// here) or DDP_HEAL_WAIT_S (30 s); the relaunch heals from it later (the
// survivor steps slowly while alone, so that the run is still going then).
TEST_F(HealMultiHost, ARankKilledOnAMachineOfItsOwnIsNamedDeadThroughItsNodesDdprun) {
  NetnsHosts hosts(2);
  const std::string dir = make_temp_dir();
  const auto launcher = hosts_launcher(hosts, "2", "heal-own");
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int h = 0; h < 2; ++h) {
    std::vector<std::string> argv = heal_argv(
        1, launcher, {"--kill", "1@150", "--relaunch_delay", "4000", "--slow_after_reform", "20"},
        train_args(dir, 2500));
    if (h == 1) argv = as_own_machine(argv);
    std::map<std::string, std::string> env = kEnv;
    env["DDP_HEAL_WAIT_S"] = "30";
    nodes.push_back(std::make_unique<Subprocess>(hosts.on(h, argv), env));
  }
  const HealRun run = gather(nodes, dir, 120s);
  expect_healed(run, 2, 2500);
  EXPECT_TRUE(dropped(run.result.out, 1)) << run.result.out;
  EXPECT_TRUE(std::regex_search(
      run.result.err,
      std::regex(
          R"(ranks that had not arrived: 1 \(pid [0-9]+, exited, as its node's ddprun saw\))")))
      << run.result.err;
  EXPECT_NE(
      run.result.out.find("heal: epoch 1: left 1 | arrived none | replaced none | world 2 -> 1"),
      std::string::npos)
      << run.result.out;
  EXPECT_NE(
      run.result.out.find("heal: epoch 2: left none | arrived 1 | replaced none | world 1 -> 2"),
      std::string::npos)
      << run.result.out;
}

// Host 1 shares host 0's /dev/shm but not its pids (a container run with
// the host's IPC namespace), and its ddprun dies: its orphan guard kills its
// ranks and sweeps the run's files. It must leave host 0's alone, though it
// cannot see their creators run: the survivors' arenas and state memory,
// from which a rank killed and relaunched on host 0 then reads the state
// straight. (The sweep removed them as dead before shm names said which
// PID namespace their pids are counted in.)
TEST_F(HealMultiHost, AHostSharingDevShmButNotPidsSweepsOnlyItsOwnFilesWhenItsDdprunDies) {
  NetnsHosts hosts(2);
  const std::string dir = make_temp_dir();
  const std::string run_id = "heal-ipc-" + std::to_string(getpid());
  const auto launcher = hosts_launcher(hosts, "1:2", run_id);
  std::map<std::string, std::string> env = kEnv;
  env["DDP_HEAL_WAIT_S"] = "2";
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int h = 0; h < 2; ++h) {
    std::vector<std::string> argv =
        heal_argv(2, launcher, {"--slow_after_reform", "10"}, train_args(dir, 1500));
    if (h == 1) argv = in_container_whose_ddprun_dies(argv, dir + "/lose-host-1");
    nodes.push_back(std::make_unique<Subprocess>(hosts.on(h, argv), env));
  }
  ASSERT_TRUE(
      wait_until([&] { return nodes[0]->read_out().find("step ") != std::string::npos; }, 60s))
      << nodes[0]->read_out() << nodes[0]->read_err();
  std::ofstream(dir + "/lose-host-1") << "now";
  const ProcessResult lost = nodes[1]->wait(30s);
  ASSERT_TRUE(lost.exited) << lost.err;
  // Host 1 swept its own ranks' state memory; host 0's two ranks still hold
  // theirs, each under its name.
  const std::string state = shm_run_prefix(run_id) + "state-p";
  const std::string here = "i" + std::to_string(pid_namespace_id()) + "-";
  std::vector<std::string> held;
  for (const std::string& name : shm_segments_of(run_id)) {
    if (name.rfind(state, 0) == 0) held.push_back(name);
  }
  EXPECT_EQ(held.size(), 2u) << ::testing::PrintToString(held);
  for (const std::string& name : held) EXPECT_NE(name.find(here), std::string::npos) << name;
  ASSERT_TRUE(wait_until(
      [&] { return nodes[0]->read_err().find("left out of round 1") != std::string::npos; }, 30s))
      << nodes[0]->read_err();
  ASSERT_TRUE(kill_after_committing(dir, 1, 400)) << nodes[0]->read_err();

  nodes.pop_back();
  HealRun run = gather(nodes, dir, 120s);
  expect_healed(run, 2, 1500);
  EXPECT_NE(run.result.out.find("[rank 1] heal: joined epoch"), std::string::npos)
      << run.result.out;
  EXPECT_NE(run.result.out.find("read straight from rank 0's state memory"), std::string::npos)
      << run.result.out;
  EXPECT_EQ(run.result.err.find("cannot open"), std::string::npos) << run.result.err;
}

// Ranks 2 and 3 go together: their optimizer shards' replicas are on the
// other host (ranks 0 and 1), which restores them and finishes alone.
TEST_F(HealMultiHost, UnderShardOptimizerAWholeHostLostMidRunLosesNoOptimizerState) {
  std::string out;
  lose_a_whole_host([](const std::string& dir) { return sharded_args(dir, 4000); }, out);
  EXPECT_NE(out.find("| optimizer shards restored first: "), std::string::npos) << out;
}

// With the rendezvous on a machine that does not train (`ddprun rendezvous
// --on_failure=heal`, as torchrun users keep etcd apart), any training host
// may be lost, the one running rank 0 included: the other host's ranks
// become ranks 0 and 1 of the next epoch and finish the run.
TEST_F(HealMultiHost, WithTheRendezvousApartTheHostOfRankZeroMayBeLost) {
  NetnsHosts hosts(3);
  const std::string dir = make_temp_dir();
  std::map<std::string, std::string> env = kEnv;
  env["DDP_HEAL_WAIT_S"] = "2";
  const std::string conf = "--rdzv_conf=heartbeat_interval=0.2,heartbeat_timeout=2,join_timeout=20";
  Subprocess server(
      hosts.on(2, {kDdprun, "rendezvous", "--port=29400", "--host=" + hosts.address(2),
                   "--run_id=heal-apart", "--nnodes=1:2", "--on_failure=heal", conf}),
      env);
  ASSERT_TRUE(
      wait_until([&] { return server.read_out().find("listening on") != std::string::npos; }, 10s))
      << server.read_out() << server.read_err();
  const std::vector<std::string> launcher = {"--nnodes=1:2", "--rdzv_backend=c10d",
                                             "--rdzv_endpoint=" + hosts.address(2) + ":29400",
                                             "--rdzv_id=heal-apart", conf};
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int h = 0; h < 2; ++h) {
    nodes.push_back(std::make_unique<Subprocess>(
        hosts.on(h, heal_argv(2, launcher, {}, train_args(dir, 4000))), env));
  }
  // The rendezvous hands out node ranks as hosts arrive: lose the one that
  // runs rank 0, once it has logged its first steps.
  int lost = -1;
  ASSERT_TRUE(wait_until(
      [&] {
        for (int h = 0; h < 2; ++h) {
          if (nodes[h]->read_out().find("[rank 0] step ") != std::string::npos) lost = h;
        }
        return lost >= 0;
      },
      60s))
      << nodes[0]->read_out() << nodes[1]->read_out();
  hosts.kill_everything_on(lost);
  ASSERT_TRUE(nodes[lost]->wait(10s).exited);

  HealRun run{nodes[1 - lost]->wait(120s), dir};
  expect_healed(run, 2, 4000);
  EXPECT_TRUE(dropped(run.result.out, 0) && dropped(run.result.out, 1)) << run.result.out;
  EXPECT_EQ(run.result.err.find("restarting the worker group"), std::string::npos)
      << run.result.err;
  const ProcessResult served = server.wait(30s);
  EXPECT_TRUE(served.exited);
  EXPECT_EQ(served.code, 0) << served.out << served.err;
  EXPECT_NE(served.err.find("left out of round 1 (--on_failure=heal); 1 node(s) go on"),
            std::string::npos)
      << served.out << served.err;
}

// A host lost mid-run, and a spare machine started in its stead (as a
// scheduler replaces a dead node): the spare takes the lost node's place in
// the running round, its ranks are admitted by the survivors and heal from
// them, and both hosts finish the run together, with no restart. (The lost
// host itself started again takes its own place the same way.) The
// survivors step slowly while the group is short, so that the run is still
// going when the spare arrives.
TEST_F(HealMultiHost, ASpareHostTakesALostHostsPlaceInTheRunningRound) {
  NetnsHosts hosts(3);
  const std::string dir = make_temp_dir();
  const auto launcher = hosts_launcher(hosts, "1:2", "heal-spare");
  std::map<std::string, std::string> env = kEnv;
  env["DDP_HEAL_WAIT_S"] = "2";
  const auto argv = [&](int h) {
    return hosts.on(h,
                    heal_argv(2, launcher, {"--slow_after_reform", "20"}, train_args(dir, 3000)));
  };
  auto node0 = std::make_unique<Subprocess>(argv(0), env);
  auto node1 = std::make_unique<Subprocess>(argv(1), env);
  ASSERT_TRUE(wait_until([&] { return node0->read_out().find("step ") != std::string::npos; }, 60s))
      << node0->read_out() << node0->read_err();
  hosts.kill_everything_on(1);
  ASSERT_TRUE(node1->wait(10s).exited);
  ASSERT_TRUE(wait_until(
      [&] { return node0->read_err().find("left out of round 1") != std::string::npos; }, 30s))
      << node0->read_err();

  Subprocess spare(argv(2), env);
  const ProcessResult joined = spare.wait(120s);
  HealRun run{node0->wait(120s), dir};
  ASSERT_TRUE(joined.exited) << joined.out << joined.err;
  EXPECT_EQ(joined.code, 0) << joined.out << joined.err;
  EXPECT_NE(joined.err.find("round 1: 2 node(s), world size 4; this node is node rank 1 with "
                            "ranks 2-3 (joined while it runs: the workers heal"),
            std::string::npos)
      << joined.err;
  EXPECT_NE(joined.out.find("[rank 2] heal: joined epoch"), std::string::npos) << joined.out;
  // The survivors admitted them (together, or one after the other), or, when
  // the spare asked before the survivors had formed the epoch without the lost
  // host (a loaded machine), in that same reform in its ranks' stead; a small
  // state (under DDP_HEAL_STRIPE_MB's default) comes from one member.
  std::smatch admitted;
  EXPECT_TRUE(std::regex_search(
      run.result.out, admitted,
      std::regex(R"((arrived [23 ]+\| replaced none \| world [23] -> [34]|)"
                 R"(left none \| arrived none \| replaced 2 3 \| world 4 -> 4) \|)"
                 R"([^\n]*MB from rank [01]\n)")))
      << run.result.out;
  std::printf("spare admitted: %s", admitted.str().c_str());
  EXPECT_NE(run.result.err.find("takes the place of lost host"), std::string::npos)
      << run.result.err;
  run.result.out += joined.out;
  run.result.err += joined.err;
  expect_healed(run, 4, 3000);
  EXPECT_EQ(run.result.err.find("restarting the worker group"), std::string::npos)
      << run.result.err;
  EXPECT_EQ(run.result.err.find("joining the next round"), std::string::npos) << run.result.err;
}

// A third host arriving while an elastic job of two runs (--nnodes=2:3)
// joins the running round as node 2 with ranks 4-5: the live ranks admit
// its workers at a step boundary, they heal from them, and the run finishes
// on six ranks with no restart. The first ranks step slowly until then (a
// new node is let in only once the program has formed its first group).
TEST_F(HealMultiHost, AHostArrivingWhileTheRoundRunsJoinsItWithoutARestart) {
  NetnsHosts hosts(3);
  const std::string dir = make_temp_dir();
  const auto launcher = hosts_launcher(hosts, "2:3", "heal-grow", ",last_call_timeout=0");
  std::vector<std::string> train = train_args(dir, 2000);
  *(std::find(train.begin(), train.end(), "--log_every") + 1) = "50";  // the first line sooner
  const auto argv = [&](int h) {
    return hosts.on(h, heal_argv(2, launcher, {"--slow_before_reform", "20"}, train));
  };
  auto node0 = std::make_unique<Subprocess>(argv(0), kEnv);
  auto node1 = std::make_unique<Subprocess>(argv(1), kEnv);
  ASSERT_TRUE(wait_until([&] { return node0->read_out().find("step ") != std::string::npos; }, 60s))
      << node0->read_out() << node0->read_err();

  Subprocess arriving(argv(2), kEnv);
  const ProcessResult joined = arriving.wait(120s);
  HealRun run{node0->wait(120s), dir};
  const ProcessResult second = node1->wait(30s);
  ASSERT_TRUE(joined.exited) << joined.out << joined.err;
  EXPECT_EQ(joined.code, 0) << joined.out << joined.err;
  EXPECT_EQ(second.code, 0) << second.out << second.err;
  EXPECT_NE(joined.err.find("round 1: 3 node(s), world size 6; this node is node rank 2 with "
                            "ranks 4-5 (joined while it runs: the workers heal"),
            std::string::npos)
      << joined.err;
  EXPECT_NE(run.result.err.find("joins running round 1 as node 2 (ranks 4-5; world 4 -> 6"),
            std::string::npos)
      << run.result.err;
  std::smatch admitted;
  EXPECT_TRUE(std::regex_search(
      run.result.out, admitted,
      std::regex(R"(arrived [45 ]+\| replaced none \| world [45] -> [56] \|[^\n]*\n)")))
      << run.result.out;
  std::printf("new host admitted: %s", admitted.str().c_str());
  run.result.out += second.out + joined.out;
  run.result.err += second.err + joined.err;
  expect_healed(run, 6, 2000);
  EXPECT_EQ(run.result.err.find("restarting the worker group"), std::string::npos)
      << run.result.err;
  EXPECT_EQ(run.result.err.find("scale-up"), std::string::npos) << run.result.err;
}

}  // namespace
}  // namespace ddp::testing
