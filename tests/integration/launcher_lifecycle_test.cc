// ddprun as a user runs it, when things end: a failed rank and how it is
// reported, signals forwarded and escalated, teardown that leaves no worker,
// grandchild or shared-memory segment, restarts, the master port, the config
// file and bad input. Real processes, real signals, real files.

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ddp/common/shm_names.h"
#include "launcher_harness.h"
#include "shm_segments.h"
#include "subprocess.h"
#include "unique_run_id.h"

namespace ddp::testing {
namespace {

using namespace launcher_test;
using ::ddp::testing::shm_segments_of;
using ::ddp::testing::unique_run_id;

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(Launcher, CrashTearsDownTheRestAndReportsTheFailedRank) {
  auto r = ddprun({"--nproc_per_node=4", "--shutdown_timeout=1", kWorker, "fail", "2", "7"});
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.code, 7);
  EXPECT_LT(r.seconds, 2.0 + 0.1);  // 100 ms head start in the worker, then teardown
  EXPECT_NE(r.err.find("rank 2 (local rank 2, pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exit code 7"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("| rank 2: first line of trouble"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("| rank 2: about to fail"), std::string::npos) << r.err;
}

TEST(Launcher, WorkerKilledBySignalGivesSignalNameAndCode) {
  auto r = ddprun({"--nproc_per_node=2", kWorker, "signal", "1", std::to_string(SIGKILL)});
  EXPECT_EQ(r.code, 128 + SIGKILL);
  EXPECT_NE(r.err.find("signal SIGKILL (9)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("out-of-memory"), std::string::npos) << r.err;
  auto segv = ddprun({"--nproc_per_node=2", kWorker, "signal", "0", std::to_string(SIGSEGV)});
  EXPECT_EQ(segv.code, 128 + SIGSEGV);
  EXPECT_NE(segv.err.find("SIGSEGV"), std::string::npos) << segv.err;
}

TEST(Launcher, WorkersIgnoringSigtermAreKilledAfterTheGracePeriod) {
  auto dir = make_temp_dir();
  auto start = std::chrono::steady_clock::now();
  Subprocess p({kDdprun, "--nproc_per_node=2", "--shutdown_timeout=0.5", kWorker, "hold", dir,
                "ignore-term"});
  ASSERT_TRUE(wait_until([&] { return read_pids(dir, "pid_").size() == 2; }, 10s));
  kill(p.pid(), SIGTERM);
  auto r = p.wait(10s);
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.code, 128 + SIGTERM);
  auto elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(elapsed, 5.0);
  for (pid_t pid : read_pids(dir, "")) EXPECT_FALSE(process_alive(pid)) << pid;
}

TEST(Launcher, ForwardedSignalsReachEveryWorkerGroup) {
  for (int sig : {SIGINT, SIGHUP, SIGQUIT}) {
    auto dir = make_temp_dir();
    Subprocess p({kDdprun, "--nproc_per_node=2", "--shutdown_timeout=5", kWorker, "hold", dir});
    ASSERT_TRUE(wait_until(
        [&] { return read_pids(dir, "child_").size() == 2 && read_pids(dir, "pid_").size() == 2; },
        10s));
    kill(p.pid(), sig);
    auto r = p.wait(10s);
    ASSERT_TRUE(r.exited) << strsignal(sig);
    EXPECT_EQ(r.code, 128 + sig) << r.err;
    // Workers die of the forwarded signal itself (well before the 5 s grace period).
    EXPECT_LT(r.seconds, 4.0);
    for (pid_t pid : read_pids(dir, "")) EXPECT_FALSE(process_alive(pid)) << pid;
  }
}

TEST(Launcher, Sigusr1IsForwardedToEachWorkerAndTheJobGoesOn) {
  auto dir = make_temp_dir();
  Subprocess p({kDdprun, "--nproc_per_node=2", kWorker, "on-usr1", dir});
  ASSERT_TRUE(wait_until([&] { return read_pids(dir, "pid_").size() == 2; }, 10s)) << p.read_err();
  kill(p.pid(), SIGUSR1);
  auto r = p.wait(10s);
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.code, 0) << r.err;  // the workers checkpointed and exited 0: a success
  for (int rank : {0, 1}) {
    // The worker got it; its child (a data loader, say) did not.
    EXPECT_NE(r.out.find("rank " + std::to_string(rank) + " got SIGUSR1, child alive"),
              std::string::npos)
        << r.out;
  }
  EXPECT_NE(r.err.find("forwarded SIGUSR1 to 2 worker(s); the job goes on"), std::string::npos)
      << r.err;
  std::filesystem::remove_all(dir);
}

TEST(Launcher, Sigusr2ToAProgramThatIgnoresNoticesEndsItAsAWorkerFailure) {
  auto dir = make_temp_dir();
  Subprocess p({kDdprun, "--nproc_per_node=2", kWorker, "hold", dir});
  ASSERT_TRUE(wait_until([&] { return read_pids(dir, "pid_").size() == 2; }, 10s)) << p.read_err();
  kill(p.pid(), SIGUSR2);
  auto r = p.wait(10s);
  ASSERT_TRUE(r.exited);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("forwarded SIGUSR2 to 2 worker(s)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("stopped workers after SIGUSR2"), std::string::npos)
      << "ddprun stopped itself:\n"
      << r.err;
  EXPECT_NE(r.err.find("SIGUSR2"), std::string::npos)
      << r.err;  // the failure names the workers' signal
  for (pid_t pid : read_pids(dir, ""))
    EXPECT_TRUE(wait_until([&] { return !process_alive(pid); }, 5s)) << pid;
  std::filesystem::remove_all(dir);
}

TEST(Launcher, ANonBlockingStdoutPipeLosesNoLine) {
  // ddprun's stdout is an O_NONBLOCK pipe whose reader starts late: the pipe
  // fills, writes fail with EAGAIN, and every line must still arrive.
  const std::string script =
      "import fcntl, os, sys\n"
      "fcntl.fcntl(1, fcntl.F_SETFL, fcntl.fcntl(1, fcntl.F_GETFL) | os.O_NONBLOCK)\n"
      "os.execv(sys.argv[1], sys.argv[1:])\n";
  auto r =
      run_process({"/bin/sh", "-c",
                   "/usr/bin/python3 -c \"$0\" \"$1\" --nproc_per_node=2 --no_prefix seq 200000 | "
                   "(sleep 1; wc -l)",
                   script, kDdprun},
                  {}, 60s);
  ASSERT_TRUE(r.exited) << r.err;
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "400000\n") << r.err;
}

TEST(Launcher, AFullDiskForTheLogFilesIsSaidOnceAndTheConsoleKeepsEveryLine) {
  if (geteuid() != 0) {
    std::printf("skipped: needs root to mount a small tmpfs\n");
    GTEST_SKIP();
  }
  auto dir = make_temp_dir();
  ASSERT_EQ(run_process({"mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", dir}, {}, 10s).code, 0);
  auto r = ddprun(
      {"--nproc_per_node=1", "--run_id=full", "--log_dir=" + dir, "--no_prefix", "seq", "100000"});
  const std::string full_run = run_dir(dir, "full");
  run_process({"umount", dir}, {}, 10s);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 100000) << "the console lost lines";
  const std::string warning =
      "warning: writing " + full_run + "/attempt_0/0/stdout.log failed (No space left on device)";
  const auto first = r.err.find(warning);
  EXPECT_NE(first, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(warning, first + 1), std::string::npos) << "said more than once:\n" << r.err;
}

TEST(Launcher, DdprunRaisesItsOpenFileLimitButWorkersGetTheOneItWasGiven) {
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_max < 512) GTEST_SKIP() << "hard open-file limit below 512";
  auto r = run_process({"/bin/sh", "-c",
                        "ulimit -Sn 256; exec \"$0\" --nproc_per_node=1 --no_prefix /bin/sh -c "
                        "'ulimit -Sn; grep \"Max open files\" /proc/$PPID/limits'",
                        kDdprun},
                       {}, 30s);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.substr(0, r.out.find('\n')), "256") << r.out;
  const std::string hard = std::to_string(limit.rlim_max);
  EXPECT_NE(r.out.find("Max open files            " + hard), std::string::npos)
      << "ddprun's soft limit:\n"
      << r.out;
}

TEST(Launcher, AStoppedWorkerIsContinuedWithTheSigtermSoItEndsWithinTheGracePeriod) {
  auto dir = make_temp_dir();
  Subprocess p({kDdprun, "--nproc_per_node=2", "--shutdown_timeout=30", kWorker, "hold", dir});
  ASSERT_TRUE(wait_until([&] { return read_pids(dir, "pid_").size() == 2; }, 10s)) << p.read_err();
  for (pid_t pid : read_pids(dir, "pid_")) kill(pid, SIGSTOP);
  const auto sent = std::chrono::steady_clock::now();
  kill(p.pid(), SIGTERM);
  auto r = p.wait(40s);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.code, 128 + SIGTERM) << r.err;
  EXPECT_LT(took, 10.0) << "the stopped workers waited for the 30 s SIGKILL:\n" << r.err;
  for (pid_t pid : read_pids(dir, ""))
    EXPECT_TRUE(wait_until([&] { return !process_alive(pid); }, 5s)) << pid;
  std::filesystem::remove_all(dir);
}

TEST(Launcher, SigkillOfDdprunLeavesNoWorkerNorGrandchild) {
  auto dir = make_temp_dir();
  Subprocess p({kDdprun, "--nproc_per_node=3", kWorker, "hold", dir, "ignore-term"});
  ASSERT_TRUE(wait_until(
      [&] { return read_pids(dir, "child_").size() == 3 && read_pids(dir, "pid_").size() == 3; },
      10s));
  auto pids = read_pids(dir, "");
  ASSERT_EQ(pids.size(), 6u);
  kill(p.pid(), SIGKILL);
  p.wait(5s);
  EXPECT_TRUE(wait_until(
      [&] {
        return std::none_of(pids.begin(), pids.end(), [](pid_t pid) { return process_alive(pid); });
      },
      5s));
  for (pid_t pid : pids) EXPECT_FALSE(process_alive(pid)) << pid;
}

TEST(SharedMemory, SegmentsOfWorkersThatDieAreRemoved) {
  // Every rank creates a segment as libddp does, then dies (SIGKILL, or exit 3)
  // before anything could unlink it.
  for (std::string how : {"kill", "exit"}) {
    const std::string run_id = unique_run_id("shm" + how);
    auto r = ddprun({"--nproc_per_node=3", "--run_id=" + run_id, kWorker, "shm-leak", how});
    ASSERT_TRUE(r.exited) << how;
    EXPECT_EQ(r.code, how == "kill" ? 128 + SIGKILL : 3) << r.err;
    // The first rank to die created its segment (the others may be stopped first).
    EXPECT_GE(count_of(r.out, "] SHM /" + shm_run_prefix(run_id)), 1u) << r.out;
    EXPECT_NE(r.err.find("shared-memory segment(s) of run " + run_id + " left by killed workers"),
              std::string::npos)
        << r.err;
    auto left = shm_segments_of(run_id);
    EXPECT_TRUE(left.empty()) << how << ": " << left.size() << " left, e.g. " << left.front();
  }
}

TEST(SharedMemory, SigkillOfDdprunLeavesNoSegmentNorWorker) {
  // ddprun dies while its workers hold segments: the orphan guard kills them and
  // removes the segments.
  auto dir = make_temp_dir();
  const std::string run_id = unique_run_id("shmsigkill");
  Subprocess p(
      {kDdprun, "--nproc_per_node=3", "--run_id=" + run_id, kWorker, "shm-leak", "hold", dir});
  ASSERT_TRUE(wait_until([&] { return read_pids(dir, "pid_").size() == 3; }, 10s)) << p.read_err();
  auto pids = read_pids(dir, "pid_");
  ASSERT_EQ(shm_segments_of(run_id).size(),
            3u);  // each rank wrote its pid after creating its segment
  kill(p.pid(), SIGKILL);
  auto r = p.wait(5s);
  EXPECT_TRUE(r.exited && r.signaled);
  EXPECT_TRUE(wait_until(
      [&] {
        return shm_segments_of(run_id).empty() &&
               std::none_of(pids.begin(), pids.end(), [](pid_t pid) { return process_alive(pid); });
      },
      5s));
  EXPECT_TRUE(shm_segments_of(run_id).empty());
  for (pid_t pid : pids) EXPECT_FALSE(process_alive(pid)) << pid;
}

TEST(SharedMemory, SegmentsOfAFailedAttemptAreRemovedBeforeTheRestart) {
  // Attempt 0: every rank creates a segment and SIGKILLs itself. Attempt 1:
  // each rank counts the run's segments from other rounds before creating its
  // own, then exits 0.
  const std::string run_id = unique_run_id("shmrestart");
  auto r = ddprun({"--nproc_per_node=2", "--max_restarts=1", "--run_id=" + run_id, kWorker,
                   "shm-leak", "kill-first"});
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("restart 1 of 1"), std::string::npos) << r.err;
  // Both attempts printed their STALE line; only attempt 1's would see attempt 0's segments.
  EXPECT_GE(count_of(r.out, "] SHM STALE 0\n"), 3u)
      << r.out;  // attempt 1 (2 ranks) + attempt 0 (>= 1)
  EXPECT_EQ(count_of(r.out, "] SHM STALE "), count_of(r.out, "] SHM STALE 0\n")) << r.out;
  EXPECT_GE(count_of(r.err, "left by killed workers"), 1u) << r.err;
  EXPECT_TRUE(shm_segments_of(run_id).empty());
}

TEST(Launcher, NormalExitKillsLeftoverGrandchildren) {
  auto dir = make_temp_dir();
  // Each worker leaves a background child behind and exits 0.
  auto r = ddprun(
      {"--nproc_per_node=2", "sh", "-c", "sleep 300 & echo $! > " + dir + "/child_$RANK; exit 0"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_LT(r.seconds, 5.0);
  for (pid_t pid : read_pids(dir, "child_")) {
    EXPECT_TRUE(wait_until([&] { return !process_alive(pid); }, 2s)) << pid;
  }
}

TEST(Launcher, RestartsTheWholeGroupWithIncreasingRestartCount) {
  auto dir = make_temp_dir();
  auto r = ddprun({"--nproc_per_node=2", "--max_restarts=3", "--run_id=rs", "--log_dir=" + dir,
                   kWorker, "fail-until", "2"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("[rank 0] attempt 2"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("restart 1 of 3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("restart 2 of 3"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("restart 3 of 3"), std::string::npos) << r.err;
  // The first rank to fail may stop the other before it prints: one of them said it.
  auto attempt1 = read_file(run_dir(dir, "rs") + "/attempt_1/0/stdout.log") +
                  read_file(run_dir(dir, "rs") + "/attempt_1/1/stdout.log");
  EXPECT_NE(attempt1.find("attempt 1\n"), std::string::npos) << attempt1;
  EXPECT_TRUE(std::filesystem::exists(run_dir(dir, "rs") + "/attempt_2/1/stdout.log"));
  auto out_of_budget =
      ddprun({"--nproc_per_node=1", "--max_restarts=1", kWorker, "fail-until", "5"});
  EXPECT_EQ(out_of_budget.code, 1);
  EXPECT_NE(out_of_budget.err.find("attempt 2 of 2"), std::string::npos) << out_of_budget.err;
}

TEST(Launcher, MasterPortIsReservedUntilTheProgramBindsIt) {
  // Workers pass a barrier whose rank 0 listens on MASTER_PORT (as a TCPStore would).
  auto r = ddprun({"--nproc_per_node=4", kWorker, "barrier"});
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_EQ(lines_with_prefix(r.out, "[rank ").size(), 4u);
  // While the job runs, a plain bind (no SO_REUSEADDR) to MASTER_PORT fails.
  auto dir = make_temp_dir();
  Subprocess p({kDdprun, "--nproc_per_node=1", "sh", "-c",
                "echo $MASTER_PORT > " + dir + "/port; sleep 30"});
  ASSERT_TRUE(wait_until([&] { return !read_file(dir + "/port").empty(); }, 10s));
  int port = std::stoi(read_file(dir + "/port"));
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_NE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
      << "port " << port << " not held";
  close(fd);
}

TEST(Launcher, MasterPortInUseIsAnError) {
  BusyPort busy;
  const int port = busy.port();
  ASSERT_GT(port, 0);
  auto dir = make_temp_dir();
  auto r =
      ddprun({"--nproc_per_node=1", "--master_port=" + std::to_string(port), kWorker, "hold", dir});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--master_port=" + std::to_string(port) + ": port in use"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(read_pids(dir, "pid_").empty());
}

TEST(Launcher, ConfigFileWithCommandLinePrecedence) {
  auto dir = make_temp_dir();
  write_file(dir + "/job.toml", "nproc_per_node = 3\nrun_id = \"from-file\"\nmax_restarts = 2\n");
  auto r = ddprun({"--config", dir + "/job.toml", "--run_id=from-cli", kWorker, "env"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto envs = env_by_rank(r.out);
  ASSERT_EQ(envs.size(), 3u);
  EXPECT_EQ(envs[0]["TORCHELASTIC_RUN_ID"], "from-cli");
  EXPECT_EQ(envs[0]["TORCHELASTIC_MAX_RESTARTS"], "2");
  // PET_* variables fill in what neither the command line nor the file sets.
  auto pet = ddprun({"--config", dir + "/job.toml", kWorker, "env"},
                    {{"PET_NPROC_PER_NODE", "2"}, {"PET_ROLE", "from-env"}});
  auto pet_envs = env_by_rank(pet.out);
  EXPECT_EQ(pet_envs.size(), 3u) << pet.err;
  EXPECT_EQ(pet_envs[0]["ROLE_NAME"], "from-env");
}

TEST(BadInput, EachGetsOneClearErrorAndStartsNothing) {
  auto dir = make_temp_dir();
  write_file(dir + "/unknown.toml", "nproc_per_node = 2\nno_such_key = 1\n");
  write_file(dir + "/broken.toml", "nproc_per_node = = =\n[[[\n");
  write_file(dir + "/blocker", "a file where a directory should be");
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  std::vector<Case> cases = {
      {{"--nproc_per_node=2"}, "no program given"},
      {{"--nproc_per_node=2", "no-such-program-xyz"},
       "'no-such-program-xyz' was not found on PATH"},
      {{"--nproc_per_node=2", dir + "/missing.py"}, "no such file"},
      {{"--nproc_per_node=0", kWorker, "hold", dir}, "--nproc_per_node=0"},
      {{"--nproc_per_node=lots", kWorker, "hold", dir}, "--nproc_per_node=lots"},
      {{"--config", dir + "/unknown.toml", kWorker, "hold", dir}, "no_such_key"},
      {{"--config", dir + "/broken.toml", kWorker, "hold", dir}, "broken.toml:1:"},
      {{"--config", dir + "/absent.toml", kWorker, "hold", dir}, "absent.toml"},
      {{"--log_dir", dir + "/blocker/sub", kWorker, "hold", dir}, "--log_dir"},
      {{"--nnodes=2", kWorker, "hold", dir}, "--nnodes=2"},
      {{"--max_restarts=-1", kWorker, "hold", dir}, "--max_restarts"},
      {{"--redirects=7", kWorker, "hold", dir}, "--redirects=7"},
      {{"--master_port=70000", kWorker, "hold", dir}, "--master_port=70000"},
      {{"--monitor_interval=0", kWorker, "hold", dir}, "--monitor_interval"},
  };
  for (const auto& c : cases) {
    auto r = ddprun(c.args);
    EXPECT_EQ(r.code, 2) << c.expected << "\n" << r.err;
    EXPECT_NE(r.err.find(c.expected), std::string::npos)
        << "expected '" << c.expected << "' in: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  EXPECT_TRUE(read_pids(dir, "pid_").empty());
}

TEST(BadInput, UnwritableLogDirIsRejected) {
  // Permission bits do not stop root, so as root use a place nobody can write: /proc.
  std::string dir = geteuid() == 0 ? "/proc/ddprun-no-such-dir" : make_temp_dir();
  if (geteuid() != 0) chmod(dir.c_str(), 0500);
  auto r = ddprun({"--log_dir", dir, kWorker, "env"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--log_dir=" + dir), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
}

}  // namespace
}  // namespace ddp::testing
