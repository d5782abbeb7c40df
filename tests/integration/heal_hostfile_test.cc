// Live recovery in a `ddprun --hostfile` job: the front end on a test host
// of its own starts each training host's agent over real ssh (namespace test
// hosts, each with Debian's sshd; needs root and openssh-server, else skips),
// with --nnodes=1:2 --on_failure=heal. A training host lost mid-run is left
// out by the rendezvous, the other host's ranks finish the run on their own,
// and the front end ends 0, naming the host the job finished without.

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

TEST_F(HealHostfile, AHostLostMidRunIsLeftOutAndTheFrontEndEndsZero) {
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
  ASSERT_TRUE(wait_until([&] { return job.read_out().find("] step ") != std::string::npos; }, 60s))
      << job.read_out() << job.read_err();
  // The machine is lost as a dead one is: its link first (nothing it says
  // reaches anyone any more), then every process on it. (Killed with its link
  // up, its agent could see its sshd die first and tell the rendezvous it was
  // stopped, which ends the round for every host.) No connection to it
  // closes: the survivors' all-reduce in flight fails once the rendezvous
  // has left the node out.
  hosts.set_link(2, false);
  hosts.kill_everything_on(2);

  HealRun run{job.wait(120s), dir};
  expect_healed(run, 2, 4000);  // the front end's exit code 0 among them
  const std::string& err = run.result.err;
  EXPECT_TRUE(dropped(run.result.out, 2) && dropped(run.result.out, 3)) << run.result.out;
  EXPECT_NE(err.find("left out of round 1 (--on_failure=heal); 1 node(s) go on"), std::string::npos)
      << err;
  EXPECT_NE(err.find("did not commit: "), std::string::npos) << err;
  EXPECT_NE(err.find("node 1 was left out by the rendezvous (node 1 (host "), std::string::npos)
      << err;
  EXPECT_NE(err.find("the ssh connection to host node2 failed or was lost (ssh exit code 255); "
                     "the other hosts go on while at least 1 of 2 remain (--nnodes=1:2)"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("[ddprun] the job finished on 1 of 2 hosts without host node2: "
                     "the ssh connection to host node2 failed or was lost"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("stopping them"), std::string::npos) << err;
}

}  // namespace
}  // namespace ddp::testing
