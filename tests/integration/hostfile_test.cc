// `ddprun --hostfile` over real ssh: test hosts are network namespaces
// (198.18.0.x) each running Debian's sshd bound to its own address, with keys
// made by the test; the front end runs on a host of its own (198.18.0.1,
// "front") with nothing but ssh to the others. Needs root and openssh-server;
// skips, saying why, otherwise. Every sshd, namespace and key is removed when
// a test ends, also when it fails.

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "netns_hosts.h"
#include "rdzv_output.h"
#include "ssh_hosts.h"
#include "ssh_test.h"
#include "subprocess.h"
#include "torch_env.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
const std::string kDdprun = DDPRUN_PATH;
const std::string kWorker = TEST_WORKER_PATH;
const std::string kTorchTrain = TORCH_TRAIN_SCRIPT;

class Hostfile : public SshTest {
 protected:
  void TearDown() override {
    ssh_.reset();  // the sshds first, then their namespaces
    net_.reset();
  }
  // `n` hosts with sshd (node1..nodeN) beside the front end's host 0.
  void start_hosts(int n, const std::vector<int>& refuse_keys = {}) {
    net_ = std::make_unique<NetnsHosts>(n + 1);
    std::vector<std::string> names = {"front"};
    std::vector<int> servers;
    for (int i = 1; i <= n; ++i) {
      names.push_back("node" + std::to_string(i));
      servers.push_back(i);
    }
    net_->name_hosts(names);
    ssh_ = std::make_unique<SshHosts>(*net_, names, servers, refuse_keys);
    work_ = make_temp_dir();
    home_ = make_temp_dir();
  }
  std::string hostfile(const std::string& text) {
    write_file(work_ + "/hosts", text);
    return work_ + "/hosts";
  }
  // The front end, on host 0 in work_ (HOME: home_), then `args` (flags, program, its args).
  std::unique_ptr<Subprocess> front(const std::vector<std::string>& args,
                                    std::map<std::string, std::string> env = {}) {
    std::vector<std::string> argv = {"env", "-C", work_, kDdprun,
                                     "--ssh_opts=-F " + ssh_->config()};
    argv.insert(argv.end(), args.begin(), args.end());
    env.emplace("HOME", home_);
    return std::make_unique<Subprocess>(net_->on(0, argv), env);
  }
  std::unique_ptr<NetnsHosts> net_;
  std::unique_ptr<SshHosts> ssh_;
  std::string work_, home_;
};

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
using Args = std::vector<std::string>;

// "W <rank> <host address> <CUDA_VISIBLE_DEVICES or all>" from each worker.
const std::vector<std::string> kWhere = {
    "--no_python", "sh", "-c",
    "echo \"W $RANK $DDP_NODE_ADDR ${CUDA_VISIBLE_DEVICES:-all} $WORLD_SIZE\""};

std::multiset<std::string> where_lines(const std::string& out) {
  std::multiset<std::string> seen;
  for (const auto& line : lines_with_prefix(out, "[rank ")) {
    const auto w = line.find("] W ");
    if (w != std::string::npos) seen.insert(line.substr(w + 4));
  }
  return seen;
}

bool all_gone(const std::set<pid_t>& pids) {
  for (pid_t pid : pids)
    if (process_alive(pid)) return false;
  return true;
}

#ifdef TRAIN_PATH
TEST_F(Hostfile, ThreeHostsTrainTheReferenceTrainer) {
  start_hosts(3);
  const std::string hosts =
      hostfile("# three boxes\nnode1 slots=2\nnode2 slots=2  # gpu box\nnode3:2\n");
  auto job =
      front({"--hostfile", hosts, "--env", "DDP_GLOO_IFACE=eth0", "--env", "OPENBLAS_NUM_THREADS=1",
             TRAIN_PATH, "--hidden", "64", "--layers", "3", "--steps", "30", "--log_every", "10"});
  auto r = job->wait(100s);
  ASSERT_TRUE(r.exited) << r.out << r.err;
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[rank 0] summary: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 0] step 30/30"), std::string::npos) << r.out;
  // Each agent's own lines come back labelled with its host.
  for (const std::string host : {"node1", "node2", "node3"}) {
    EXPECT_NE(r.err.find("[ddprun " + host + "] round 1: 3 node(s), world size 6"),
              std::string::npos)
        << r.err;
  }
  EXPECT_EQ(r.err.find("unauthenticated"), std::string::npos) << r.err;
}

#endif  // TRAIN_PATH

// examples/torch/train_ddp.py (torch.distributed over Gloo, init from env://)
// on three hosts: the interpreter goes as PYTHON_EXEC, Gloo's interface as --env.
TEST_F(Hostfile, ThreeHostsTrainTheTorchDdpExample) {
  if (auto reason = torch2_unavailable_reason(); !reason.empty()) GTEST_SKIP() << reason;
  start_hosts(3);
  const std::string hosts = hostfile("node1 slots=1\nnode2 slots=1\nnode3 slots=1\n");
  auto r = front({"--hostfile", hosts, "--env", "GLOO_SOCKET_IFNAME=eth0", kTorchTrain, "--epochs",
                  "1", "--samples", "192"},
                 {{"PYTHON_EXEC", torch2_python()}})
               ->wait(120s);
  ASSERT_TRUE(r.exited) << r.out << r.err;
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  std::set<std::string> weights;
  for (int rank = 0; rank < 3; ++rank) {
    auto lines = lines_with_prefix(r.out, "[rank " + std::to_string(rank) + "] FINAL_WEIGHTS ");
    ASSERT_EQ(lines.size(), 1u) << r.out;
    weights.insert(lines[0].substr(lines[0].find(' ')));  // without "rank=N"
  }
  EXPECT_EQ(weights.size(), 1u) << "the ranks ended with different weights:\n" << r.out;
}

TEST_F(Hostfile, HostsFlagAndIncludePickHostsAndDevices) {
  start_hosts(3);
  const std::string hosts = hostfile("node1 slots=2\nnode2 slots=2\nnode3 slots=3\n");
  auto r = front(Args{"--hostfile", hosts, "--include", "node1@node3:0,2"} + kWhere)->wait(40s);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(where_lines(r.out),
            (std::multiset<std::string>{"0 198.18.0.2 all 4", "1 198.18.0.2 all 4",
                                        "2 198.18.0.4 0,2 4", "3 198.18.0.4 0,2 4"}))
      << r.out;
  r = front(Args{"--hostfile", hosts, "--exclude", "node2@node1:0"} + kWhere)->wait(40s);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(where_lines(r.out),
            (std::multiset<std::string>{"0 198.18.0.2 1 4", "1 198.18.0.4 all 4",
                                        "2 198.18.0.4 all 4", "3 198.18.0.4 all 4"}))
      << r.out;
  r = front(Args{"-H", "node2:1,node3:1"} + kWhere)->wait(40s);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(where_lines(r.out),
            (std::multiset<std::string>{"0 198.18.0.3 all 2", "1 198.18.0.4 all 2"}))
      << r.out;
}

// Hosts given by their IPv6 addresses, bare and in brackets: ssh reaches
// them, the rendezvous runs on the first one's ([2001:2::2]:29400) and every
// node advertises its IPv6 address.
TEST_F(Hostfile, Ipv6AddressesLaunchAndFormTheRendezvous) {
  start_hosts(2);
  const std::string hosts =
      hostfile(net_->address6(1) + " slots=2\n[" + net_->address6(2) + "]:1\n");
  auto r = front(Args{"--hostfile", hosts} + kWhere)->wait(40s);
  ASSERT_TRUE(r.exited) << r.out << r.err;
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string a = net_->address6(1), b = net_->address6(2);
  EXPECT_EQ(where_lines(r.out), (std::multiset<std::string>{
                                    "0 " + a + " all 3", "1 " + a + " all 3", "2 " + b + " all 3"}))
      << r.out << r.err;
  EXPECT_NE(r.err.find("[ddprun " + a + "] round 1: 2 node(s), world size 3"), std::string::npos)
      << r.err;
}

// Long lines from every host at once come back whole: each is one line of the
// front end's output, never cut or mixed with another host's.
TEST_F(Hostfile, EveryHostsLinesComeBackWhole) {
  start_hosts(3);
  const std::string hosts = hostfile("node1 slots=2\nnode2 slots=2\nnode3 slots=2\n");
  auto r = front({"--hostfile", hosts, "--no_python", "sh", "-c",
                  "i=0; while [ $i -lt 40 ]; do printf \"L%s %08000d\\n\" $RANK $i; "
                  "i=$((i+1)); done"})
               ->wait(60s);
  ASSERT_EQ(r.code, 0) << r.err;
  std::map<int, int> lines;
  for (int rank = 0; rank < 6; ++rank) {
    const std::string prefix = "[rank " + std::to_string(rank) + "] L" + std::to_string(rank) + " ";
    for (const auto& line : lines_with_prefix(r.out, prefix)) {
      EXPECT_EQ(line.size(), 8000u);
      EXPECT_EQ(line.find_first_not_of("0123456789"), std::string::npos);
      ++lines[rank];
    }
    EXPECT_EQ(lines[rank], 40) << "rank " << rank;
  }
}

// A console nobody reads for 4 s (a full pipe: `ddprun ... | less`, or a
// terminal held with Ctrl-S) blocks the front end's output, not its
// keep-alives: the hosts go on, and every line arrives.
TEST_F(Hostfile, AConsoleThatBlocksDoesNotStopTheJob) {
  start_hosts(2);
  const std::string hosts = hostfile("node1 slots=1\nnode2 slots=1\n");
  const std::string job = kDdprun + " '--ssh_opts=-F " + ssh_->config() + "' --hostfile " + hosts +
                          " --no_python sh -c 'seq 20000 | sed s/^/line-/'";
  auto r =
      Subprocess(
          net_->on(0, {"sh", "-c", "cd " + work_ + " && " + job + " | (sleep 4; grep -c line-)"}),
          {{"HOME", home_}})
          .wait(60s);
  ASSERT_TRUE(r.exited) << r.err;
  EXPECT_EQ(r.out, "40000\n") << r.err;
  EXPECT_EQ(r.err.find("no word from the front end"), std::string::npos) << r.err;
}

TEST_F(Hostfile, DdpEnvFileEnvFlagsAndTheWorkingDirectoryGoWithTheJob) {
  start_hosts(2);
  write_file(home_ + "/.ddp_env", "FROM_HOME=home\nBOTH=home\n");
  write_file(work_ + "/.ddp_env", "# the project's\nBOTH=work dir\nexport SPACED=a b  c\n");
  const std::string hosts = hostfile("node1 slots=1\nnode2 slots=1\n");
  auto r =
      front({"--hostfile", hosts, "--env", "GIVEN=x'y", "--env", "FROM_SHELL", "--no_python", "sh",
             "-c",
             "echo \"E $RANK $FROM_HOME|$BOTH|$SPACED|$GIVEN|$FROM_SHELL|$(pwd)|$PYTHON_EXEC\""},
            {{"FROM_SHELL", "shell value"}, {"PYTHON_EXEC", "/opt/py/bin/python3"}})
          ->wait(40s);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(
        lines_with_prefix(r.out, "[rank " + std::to_string(rank) + "] E "),
        std::vector<std::string>{std::to_string(rank) + " home|work dir|a b  c|x'y|shell value|" +
                                 work_ + "|/opt/py/bin/python3"})
        << r.out << r.err;
  }
  // A .ddp_env line that is not NAME=VALUE: one line naming the file and line, exit 2.
  write_file(work_ + "/.ddp_env", "OK=1\nnot a variable\n");
  r = front({"--hostfile", hosts, kWorker, "env"})->wait(20s);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(work_ + "/.ddp_env:2: 'not a variable' is not NAME=VALUE"),
            std::string::npos)
      << r.err;
}

// The front end in a directory the hosts do not have (a tmpfs mounted in the
// front end's own mount namespace): the launch fails naming the host and the
// directory, before any worker starts.
TEST_F(Hostfile, AWorkingDirectoryMissingOnAHostFailsTheLaunch) {
  start_hosts(2);
  const std::string hosts = hostfile("node1 slots=1\nnode2 slots=1\n");
  const std::string hidden = make_temp_dir();
  const std::string here = hidden + "/only-here";
  const std::string script =
      "mount -t tmpfs none " + hidden + " && mkdir " + here + " && cd " + here + " && exec \"$@\"";
  auto r = Subprocess(net_->on(0, {"unshare", "-m", "--propagation", "private", "sh", "-c", script,
                                   "sh", kDdprun, "--ssh_opts=-F " + ssh_->config(), "--hostfile",
                                   hosts, kWorker, "env"}),
                      {{"HOME", home_}})
               .wait(30s);
  ASSERT_TRUE(r.exited) << r.err;
  EXPECT_EQ(r.code, 2) << r.err;
  for (const std::string host : {"node1", "node2"}) {
    EXPECT_NE(r.err.find("error: host " + host +
                         ": its agent ended with exit code 2: [ddprun] "
                         "error: the working directory " +
                         here + " does not exist on this host"),
              std::string::npos)
        << r.err;
  }
  EXPECT_EQ(r.out.find("ENV RANK"), std::string::npos) << r.out;
}

TEST_F(Hostfile, AFailingRankIsReportedWithItsHostRankAndStderr) {
  start_hosts(3);
  const std::string hosts = hostfile("node1 slots=2\nnode2 slots=2\nnode3 slots=2\n");
  auto r = front({"--hostfile", hosts, kWorker, "fail", "3", "7"})->wait(60s);
  ASSERT_TRUE(r.exited) << r.err;
  EXPECT_EQ(r.code, 7) << r.err;
  EXPECT_NE(r.err.find("the first failure was on host node2: worker failed: rank 3 (local rank 1"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("| rank 3: about to fail"), std::string::npos) << r.err;
}

TEST_F(Hostfile, CtrlCStopsEveryWorkerOnEveryHost) {
  start_hosts(3);
  const std::string dir = make_temp_dir();
  const std::string hosts = hostfile("node1 slots=2\nnode2 slots=2\nnode3 slots=2\n");
  auto job = front({"--hostfile", hosts, "--shutdown_timeout=3", kWorker, "hold", dir});
  ASSERT_TRUE(wait_until([&] { return read_pids(dir, "child_").size() == 6; }, 30s))
      << job->read_err();
  const auto pids = read_pids(dir, "");
  kill(-job->pid(), SIGINT);  // as the terminal sends it, to the front end's process group
  auto r = job->wait(20s);
  ASSERT_TRUE(r.exited) << r.err;
  EXPECT_EQ(r.code, 130) << r.err;
  EXPECT_TRUE(all_gone(pids)) << r.err;
  EXPECT_NE(r.err.find("received SIGINT: stopping the workers on every host"), std::string::npos)
      << r.err;
}

// `ddprun --hostfile ... | head`: once head exits, the front end stops every
// host's workers, as a local job does, and exits 141 (128+SIGPIPE).
TEST_F(Hostfile, TheConsolesReaderExitingStopsEveryHostsWorkers) {
  start_hosts(2);
  const std::string dir = make_temp_dir();
  const std::string hosts = hostfile("node1 slots=1\nnode2 slots=1\n");
  const std::string job = kDdprun + " '--ssh_opts=-F " + ssh_->config() + "' --hostfile " + hosts +
                          " --no_python sh -c 'echo $$ >" + dir +
                          "/pid_$RANK; while :; do echo line; sleep 0.05; done' 2>" + dir + "/err";
  auto r = Subprocess(net_->on(0, {"bash", "-c",
                                   "cd " + work_ + " && " + job +
                                       " | head -n 3 >/dev/null; echo \"exit ${PIPESTATUS[0]}\""}),
                      {{"HOME", home_}})
               .wait(60s);
  ASSERT_TRUE(r.exited) << r.err;
  EXPECT_EQ(r.out, "exit 141\n") << read_file(dir + "/err");
  const auto pids = read_pids(dir, "pid_");
  EXPECT_EQ(pids.size(), 2u);
  EXPECT_TRUE(wait_until([&] { return all_gone(pids); }, 5s));
  EXPECT_NE(read_file(dir + "/err").find("the console was closed"), std::string::npos)
      << read_file(dir + "/err");
}

// SIGUSR1 at the front end (a scheduler's preemption notice) reaches every
// host's workers, and the job goes on to its end.
TEST_F(Hostfile, Sigusr1AtTheFrontEndReachesEveryWorker) {
  start_hosts(2);
  const std::string dir = make_temp_dir();
  const std::string hosts = hostfile("node1 slots=1\nnode2 slots=1\n");
  auto job = front({"--hostfile", hosts, kWorker, "on-usr1", dir});
  ASSERT_TRUE(wait_until([&] { return read_pids(dir, "pid_").size() == 2; }, 30s))
      << job->read_err();
  kill(job->pid(), SIGUSR1);
  auto r = job->wait(20s);
  ASSERT_TRUE(r.exited) << r.err;
  EXPECT_EQ(r.code, 0) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(r.out.find("[rank " + std::to_string(rank) + "] rank " + std::to_string(rank) +
                         " got SIGUSR1"),
              std::string::npos)
        << r.out;
  }
}

TEST_F(Hostfile, ASigkilledFrontEndLeavesNoWorkerOnAnyHost) {
  start_hosts(3);
  const std::string dir = make_temp_dir();
  const std::string hosts = hostfile("node1 slots=2\nnode2 slots=2\nnode3 slots=2\n");
  // Workers that ignore SIGTERM, and a long grace: only the lost channel's hard stop ends them.
  auto job =
      front({"--hostfile", hosts, "--shutdown_timeout=60", kWorker, "hold", dir, "ignore-term"});
  ASSERT_TRUE(wait_until([&] { return read_pids(dir, "child_").size() == 6; }, 30s))
      << job->read_err();
  const auto pids = read_pids(dir, "");
  kill(job->pid(), SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  EXPECT_TRUE(wait_until([&] { return all_gone(pids); }, 10s));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_LT(took, 2.5) << "the workers outlived the front end by " << took << " s";
}

// A host's link cut mid-job: that host's agent loses the rendezvous and the
// others lose it (fast heartbeats, as a user may set them): every worker on
// every host is gone within the heartbeat timeout, and the front end ends
// once ssh's keep-alives give up on the cut host.
TEST_F(Hostfile, ACutLinkToOneHostStopsTheWorkersEverywhere) {
  start_hosts(3);
  const std::string dir = make_temp_dir();
  const std::string hosts = hostfile("node1 slots=2\nnode2 slots=2\nnode3 slots=2\n");
  // ssh's keep-alives every second (the last --ssh_opts is the one, and the
  // user's options win over ddprun's 5 s): the front end gives up on node3
  // after about 3 s, not 15 s.
  auto job =
      front({"--hostfile", hosts, "--shutdown_timeout=1",
             "--ssh_opts=-F " + ssh_->config() + " -o ServerAliveInterval=1",
             "--rdzv_conf=heartbeat_interval=0.2,heartbeat_timeout=2", kWorker, "hold", dir});
  ASSERT_TRUE(wait_until([&] { return read_pids(dir, "child_").size() == 6; }, 30s))
      << job->read_err();
  const auto pids = read_pids(dir, "");
  net_->set_link(3, false);  // node3
  EXPECT_TRUE(wait_until([&] { return all_gone(pids); }, 6s)) << job->read_err();
  auto r = job->wait(40s);
  ASSERT_TRUE(r.exited) << r.err;
  EXPECT_NE(r.code, 0) << r.err;
}

// The front end's own network cut: every agent misses its keep-alive lines
// and stops its workers (which ignore SIGTERM) within 2 s. Before that, a
// Ctrl-Z at the front end is refused, so that the job is not taken for lost.
TEST_F(Hostfile, AFrontEndCutOffLeavesNoWorkerOnAnyHost) {
  start_hosts(3);
  const std::string dir = make_temp_dir();
  const std::string hosts = hostfile("node1 slots=2\nnode2 slots=2\nnode3 slots=2\n");
  auto job =
      front({"--hostfile", hosts, "--shutdown_timeout=60", kWorker, "hold", dir, "ignore-term"});
  ASSERT_TRUE(wait_until([&] { return read_pids(dir, "child_").size() == 6; }, 30s))
      << job->read_err();
  const auto pids = read_pids(dir, "");
  kill(-job->pid(), SIGTSTP);  // as the terminal sends Ctrl-Z
  std::this_thread::sleep_for(2500ms);
  for (pid_t pid : pids) EXPECT_TRUE(process_alive(pid)) << "lost pid " << pid << " after Ctrl-Z";
  EXPECT_TRUE(
      wait_until([&] { return job->read_err().find("Ctrl-Z ignored") != std::string::npos; }, 2s))
      << job->read_err();
  net_->set_link(0, false);  // the front end's host
  const auto cut = std::chrono::steady_clock::now();
  EXPECT_TRUE(wait_until([&] { return all_gone(pids); }, 10s));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
  EXPECT_LT(took, 2.5) << "the workers outlived the front end's link by " << took << " s";
}

TEST_F(Hostfile, AnUnreachableHostOrARefusedKeyFailsTheLaunchBeforeAnyWorkerStarts) {
  start_hosts(3, /*refuse_keys=*/{2});
  ssh_->stop(3);  // node3: nothing listens on port 22
  const std::string dir = make_temp_dir();
  // 198.18.0.99 is on the test hosts' switch, where nothing answers.
  const std::string hosts =
      hostfile("node1 slots=1\nnode2 slots=1\nnode3 slots=1\n198.18.0.99 slots=1\n");
  auto r = front({"--hostfile", hosts, "--ssh_timeout=3", kWorker, "hold", dir})->wait(30s);
  ASSERT_TRUE(r.exited) << r.err;
  EXPECT_NE(r.code, 0);
  EXPECT_LT(r.seconds, 3.0 + 2.5) << r.err;
  EXPECT_NE(
      r.err.find("error: host node2: ssh failed (exit code 255): root@node2: Permission denied"),
      std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("error: host node3: ssh failed (exit code 255)"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("error: host 198.18.0.99:"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("error: host node1"), std::string::npos) << r.err;
  EXPECT_TRUE(read_pids(dir, "").empty()) << "a worker started";
}

// Ctrl-C while a host is still being reached: the launch stops at once and
// nothing starts anywhere.
TEST_F(Hostfile, CtrlCWhileTheHostsAnswerStartsNothing) {
  start_hosts(1);
  const std::string dir = make_temp_dir();
  // 198.18.0.99 is on the test hosts' switch, where nothing answers.
  const std::string hosts = hostfile("node1 slots=1\n198.18.0.99 slots=1\n");
  auto job = front({"--hostfile", hosts, "--ssh_timeout=20", kWorker, "hold", dir});
  std::this_thread::sleep_for(1s);
  kill(-job->pid(), SIGINT);
  auto r = job->wait(10s);
  ASSERT_TRUE(r.exited) << r.err;
  EXPECT_EQ(r.code, 130) << r.err;
  EXPECT_LT(r.seconds, 1.0 + 3.0) << r.err;
  EXPECT_NE(r.err.find("received SIGINT while starting the hosts; none was started"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(read_pids(dir, "").empty()) << "a worker started";
}

TEST_F(Hostfile, TwoJobsOnTheSameHostsStoppingOneLeavesTheOther) {
  start_hosts(2);
  const std::string dir_a = make_temp_dir(), dir_b = make_temp_dir();
  const std::string hosts = hostfile("node1 slots=2\nnode2 slots=2\n");
  auto a = front({"--hostfile", hosts, "--shutdown_timeout=3", kWorker, "hold", dir_a});
  auto b = front({"--hostfile", hosts, "--shutdown_timeout=3", kWorker, "hold", dir_b});
  ASSERT_TRUE(wait_until([&] { return read_pids(dir_a, "child_").size() == 4; }, 30s))
      << a->read_err();
  ASSERT_TRUE(wait_until([&] { return read_pids(dir_b, "child_").size() == 4; }, 30s))
      << b->read_err();
  const auto pids_a = read_pids(dir_a, ""), pids_b = read_pids(dir_b, "");
  kill(a->pid(), SIGTERM);
  auto r = a->wait(20s);
  ASSERT_TRUE(r.exited) << r.err;
  EXPECT_EQ(r.code, 143) << r.err;
  EXPECT_TRUE(all_gone(pids_a));
  std::this_thread::sleep_for(500ms);
  for (pid_t pid : pids_b) EXPECT_TRUE(process_alive(pid)) << "job b lost pid " << pid;
  kill(b->pid(), SIGTERM);
  EXPECT_EQ(b->wait(20s).code, 143);
  EXPECT_TRUE(all_gone(pids_b));
}

TEST(HostfileInput, BadHostfilesAndFlagsFailWithOneLineAndExitTwo) {
  const std::string work = make_temp_dir();
  struct Case {
    std::string text, flag, expected;
  };
  const std::vector<Case> cases = {
      {"a slots=2\nb slots=two\n", "", "hosts:2: slots 'two' is not a number"},
      {"a slots=2\n\n# x\na slots=1\n", "", "hosts:4: host 'a' is listed twice (first on line 1)"},
      {"a slots=0\n", "", "hosts:1: host 'a' has 0 slots (at least 1 is needed)"},
      {"a slots=2\nb slots=2\n", "--include=c", "--include=c: host 'c' is not in "},
  };
  for (const auto& c : cases) {
    write_file(work + "/hosts", c.text);
    std::vector<std::string> argv = {kDdprun, "--hostfile", work + "/hosts"};
    if (!c.flag.empty()) argv.push_back(c.flag);
    argv.insert(argv.end(), {kWorker, "env"});
    ProcessResult r = run_process(argv, {}, 20s);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

}  // namespace
}  // namespace ddp::testing
