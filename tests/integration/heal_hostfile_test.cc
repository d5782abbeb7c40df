// Live recovery in a `ddprun --hostfile` job: the front end on a test host
// of its own starts each training host's agent over real ssh (namespace test
// hosts, each with Debian's sshd; needs root and openssh-server, else skips),
// with --nnodes=1:2 --on_failure=heal. A training host lost mid-run (the
// machine, or only its ssh connection) is left out by the rendezvous, the
// other host's ranks finish the run on their own, and the front end ends 0,
// naming the host the job finished without.

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "heal_run.h"
#include "netns_hosts.h"
#include "ssh_hosts.h"
#include "ssh_test.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;

class HealHostfile : public SshTest {};

// How node2 is lost mid-run.
enum class Loss {
  // As a dead machine is: its link first (nothing it says reaches anyone any
  // more), then every process on it. (Killed with its link up, its agent
  // could see its sshd die first and stop itself, which is the other case.)
  // No connection to it closes: the survivors' all-reduce in flight fails
  // once the rendezvous has left the node out.
  kMachine,
  // Only its ssh connection to the front end falls silent: the agent stops
  // its workers (it leaves no orphan) and leaves the round, which goes on
  // without it.
  kSshConnection,
};

// The front end on a host of its own starts node1 (the rendezvous) and
// node2 over ssh with --nnodes=1:2 --on_failure=heal; node2 is lost once
// both train. Returns the front end's end, checked to be a healed run of
// ranks 0-1 alone that ended 0 without host node2.
HealRun lose_node2(Loss loss) {
  NetnsHosts hosts(3);  // the front end's host, node1 (the rendezvous), node2
  const std::vector<std::string> names = {"front", "node1", "node2"};
  hosts.name_hosts(names);
  SshHosts ssh(hosts, names, {1, 2});
  const std::string dir = make_temp_dir(), work = make_temp_dir(), home = make_temp_dir();
  write_file(work + "/hosts", "node1 slots=2\nnode2 slots=2\n");
  // ssh's keep-alives every second: the front end gives up on the lost host
  // after about 3 s, not 15 s.
  std::vector<std::string> argv = {
      "env", "-C", work, kDdprun, "--ssh_opts=-F " + ssh.config() + " -o ServerAliveInterval=1",
      "--hostfile", work + "/hosts", "--nnodes=1:2", "--on_failure=heal", "--max_restarts=4",
      // A host lost in 2 s; the survivors drop its ranks after 2 s.
      "--rdzv_conf=heartbeat_interval=0.2,heartbeat_timeout=2,join_timeout=20", "--env",
      "DDP_HEAL_WAIT_S=2", "--env", "OPENBLAS_NUM_THREADS=1", "--env", "DDP_GLOO_IFACE=eth0",
      kWorker};
  for (const auto& a : train_args(dir, 4000)) argv.push_back(a);
  Subprocess job(hosts.on(0, argv), {{"HOME", home}});
  // Both hosts train (rank 0 has logged its first steps), then node2 is lost.
  EXPECT_TRUE(wait_until([&] { return job.read_out().find("] step ") != std::string::npos; }, 60s))
      << job.read_out() << job.read_err();
  if (loss == Loss::kMachine) {
    hosts.set_link(2, false);
    hosts.kill_everything_on(2);
  } else {
    // The front end's ssh client for node2 (namespace hosts share one kernel)
    // stops: the connection falls silent, as when its network is cut, and
    // node2's agent stops itself. Once the rendezvous has said what became
    // of node2, the client goes (as ssh's keep-alives would end it).
    const std::vector<std::string> client = {"-f", "^ssh .* -- node2 "};
    EXPECT_EQ(run_process({"pkill", "-STOP", client[0], client[1]}, {}, 10s).code, 0);
    EXPECT_TRUE(wait_until(
        [&] {
          const std::string err = job.read_err();
          return err.find("left out of round 1") != std::string::npos ||
                 err.find("round 1 ended") != std::string::npos;
        },
        60s))
        << job.read_err();
    EXPECT_EQ(run_process({"pkill", "-KILL", client[0], client[1]}, {}, 10s).code, 0);
  }

  HealRun run{job.wait(120s), dir};
  expect_healed(run, 2, 4000);  // the front end's exit code 0 among them
  const std::string& err = run.result.err;
  EXPECT_TRUE(dropped(run.result.out, 2) && dropped(run.result.out, 3)) << run.result.out;
  EXPECT_NE(err.find("left out of round 1 (--on_failure=heal); 1 node(s) go on"), std::string::npos)
      << err;
  EXPECT_NE(err.find("the other hosts go on while at least 1 of 2 remain (--nnodes=1:2)"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("[ddprun] the job finished on 1 of 2 hosts without host node2: "),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("stopping them"), std::string::npos) << err;
  return run;
}

TEST_F(HealHostfile, AHostLostMidRunIsLeftOutAndTheFrontEndEndsZero) {
  const HealRun run = lose_node2(Loss::kMachine);
  const std::string& err = run.result.err;
  EXPECT_NE(err.find("did not commit: "), std::string::npos) << err;
  EXPECT_NE(err.find("node 1 was left out by the rendezvous (node 1 (host "), std::string::npos)
      << err;
}

// The host itself lives: its agent stops its workers as it must with no
// front end to answer to, and leaves as a lost node would, instead of
// reporting a stop that would end the round on every host.
TEST_F(HealHostfile, AHostWhoseSshConnectionIsLostLeavesTheRoundAndTheOthersGoOn) {
  const HealRun run = lose_node2(Loss::kSshConnection);
  const std::string& err = run.result.err;
  // Its own lines went with its connection; the rendezvous's say how it left.
  EXPECT_NE(err.find("node 1 (host 'vm') stopped sending heartbeats for "), std::string::npos)
      << err;
  EXPECT_EQ(err.find("was stopped by SIGTERM"), std::string::npos) << err;
}

}  // namespace
}  // namespace ddp::testing
