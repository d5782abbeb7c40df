// --hang_timeout: ddprun finds a worker group that makes no progress, names
// the rank to blame (and, for libddp collectives, who waits for it), shows
// where each stuck rank is, stops the group and exits 124, or restarts it.

#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "netns_hosts.h"
#include "netns_test.h"
#include "subprocess.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
const std::string kDdprun = DDPRUN_PATH;
const std::string kWorker = TEST_WORKER_PATH;
const std::string kCollectiveWorker = COLLECTIVE_WORKER_PATH;

bool have_tool(const std::string& name) {
  return access(("/usr/bin/" + name).c_str(), X_OK) == 0 ||
         access(("/bin/" + name).c_str(), X_OK) == 0;
}

// The first line of ddprun's report (after "[ddprun] ").
std::string headline(const std::string& err) {
  auto at = err.find("worker group hung");
  if (at == std::string::npos) return "";
  return err.substr(at, err.find('\n', at) - at);
}

std::string write_script(const std::string& dir, const std::string& text) {
  std::string path = dir + "/job.py";
  write_file(path, text);
  return path;
}

TEST(Hang, AStoppedLibddpRankIsNamedWithTheRanksWaitingForIt) {
  auto r =
      run_process({kDdprun, "--nproc_per_node=3", "--hang_timeout=1.5", kCollectiveWorker, "stop"},
                  {{"DDP_BACKEND", "shm"}}, 60s);
  ASSERT_TRUE(r.exited) << r.err;
  EXPECT_EQ(r.code, 124) << r.err;
  const std::string head = headline(r.err);
  // Rank 1 stopped itself; ranks 0 and 2 are stuck in the 4th all_reduce
  // because of it: only rank 1 is blamed.
  EXPECT_NE(head.find("no progress for 1.5 s"), std::string::npos) << r.err;
  EXPECT_NE(head.find(": rank 1 (local rank 1, pid "), std::string::npos) << r.err;
  EXPECT_EQ(head.find("rank 0"), std::string::npos) << head;
  EXPECT_NE(
      r.err.find(
          "rank 1: stopped (SIGSTOP or a debugger), between collectives (3 done); ranks 0, 2 wait "
          "for it in all_reduce #4"),
      std::string::npos)
      << r.err;
  if (have_tool("eu-stack") || have_tool("gdb")) {
    // The blamed rank's stacks first.
    const auto blamed_stacks = r.err.find("rank 1, native stacks:");
    EXPECT_NE(blamed_stacks, std::string::npos) << r.err;
    EXPECT_GT(r.err.find("rank 0, native stacks:"), blamed_stacks) << r.err;
    EXPECT_NE(r.err.find("all_reduce"), std::string::npos)
        << r.err;  // rank 0's frames: in the collective
    EXPECT_NE(r.err.find("#0 "), std::string::npos) << r.err;
  } else {
    std::printf("eu-stack and gdb missing: the stacks part is not checked\n");
  }
  // Found within the timeout plus sampling and the stack tools, and the
  // stopped rank ended without waiting out a grace period.
  EXPECT_LT(r.seconds, 15.0) << r.err;
}

TEST(Hang, ANativeProgramUsingNoCpuIsHungAndTheGroupStopped) {
  auto dir = make_temp_dir();
  auto r = run_process({kDdprun, "--nproc_per_node=2", "--hang_timeout=1", kWorker, "hold", dir},
                       {}, 60s);
  ASSERT_TRUE(r.exited) << r.err;
  EXPECT_EQ(r.code, 124) << r.err;
  // Both ranks hold; rank 1 is named too unless it was still starting (used
  // CPU) within the first second, as on a loaded machine.
  EXPECT_TRUE(std::regex_search(headline(r.err), std::regex(": ranks? 0 \\(local rank 0")))
      << r.err;
  EXPECT_NE(r.err.find("rank 0: used no CPU time"), std::string::npos) << r.err;
  // Nothing of the group is left: the held grandchildren are gone too.
  for (const char* name : {"/child_0", "/child_1"}) {
    pid_t child = std::stoi(read_file(dir + name));
    EXPECT_TRUE(wait_until([&] { return !process_alive(child); }, 5s)) << name;
  }
}

TEST(Hang, APythonRanksReportHasEveryThreadsTraceback) {
  auto dir = make_temp_dir();
  // Rank 1 deadlocks on a lock it holds, with a helper thread waiting too;
  // rank 0 computes (uses CPU: progress).
  std::string script = write_script(dir, R"(import os, threading
def helper():
    threading.Event().wait()
threading.Thread(target=helper, name="helper", daemon=True).start()
if os.environ["RANK"] == "1":
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()  # the deadlock
while True:
    sum(range(1000))
)");
  auto r = run_process(
      {kDdprun, "--nproc_per_node=2", "--hang_timeout=1.5", "/usr/bin/python3", script}, {}, 60s);
  ASSERT_TRUE(r.exited) << r.err;
  EXPECT_EQ(r.code, 124) << r.err;
  const std::string head = headline(r.err);
  EXPECT_NE(head.find(": rank 1 (local rank 1"), std::string::npos) << r.err;
  EXPECT_EQ(head.find("rank 0"), std::string::npos) << head;
  EXPECT_NE(r.err.find("rank 1, Python traceback (faulthandler):"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("  | Current thread"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("job.py\", line 8 in <module>"), std::string::npos)
      << r.err;  // the second acquire
  EXPECT_NE(r.err.find("job.py\", line 3 in helper"), std::string::npos) << r.err;
}

TEST(Hang, AHungGroupIsRestartedWhileRestartsRemain) {
  auto dir = make_temp_dir();
  std::string script = write_script(dir, R"(import os, time
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    time.sleep(600)
print("done on restart", os.environ["TORCHELASTIC_RESTART_COUNT"], flush=True)
)");
  auto r = run_process({kDdprun, "--nproc_per_node=2", "--hang_timeout=1", "--max_restarts=1",
                        "/usr/bin/python3", script},
                       {}, 60s);
  ASSERT_TRUE(r.exited) << r.err;
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("worker group hung"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("restarting the worker group (restart 1 of 1)"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("done on restart 1"), std::string::npos) << r.out;
}

TEST(Hang, RanksThatMakeProgressAreNeverCalledHung) {
  // All-reduces from 4 KiB to 64 MiB (steady progress, the large ones taking
  // a while each) under a short timeout: finishes normally.
  auto r = run_process(
      {kDdprun, "--nproc_per_node=2", "--hang_timeout=1", kCollectiveWorker, "large", "64"}, {},
      120s);
  ASSERT_TRUE(r.exited) << r.err;
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("hung"), std::string::npos) << r.err;
}

TEST(Hang, AMalformedTimeoutIsAnErrorNamingTheFlag) {
  for (const std::string bad : {"--hang_timeout=-1", "--hang_timeout=0.1", "--hang_timeout=soon"}) {
    auto r = run_process({kDdprun, "--nproc_per_node=1", bad, kWorker, "env"}, {}, 20s);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.err;
    EXPECT_NE(r.err.find("--hang_timeout"), std::string::npos) << bad << ": " << r.err;
  }
  auto env = run_process({kDdprun, "--nproc_per_node=1", kWorker, "env"},
                         {{"PET_HANG_TIMEOUT", "-3"}}, 20s);
  EXPECT_EQ(env.code, 2) << env.err;
  // A value from the variable is named as the variable.
  EXPECT_NE(env.err.find("PET_HANG_TIMEOUT=-3"), std::string::npos) << env.err;
}

// Across hosts: rank 1 (on host hang-b) stops itself; rank 0 (hang-a) waits
// for it in all_reduce #4. Both agents find the hang; hang-a's ranks wait for
// another node, so it holds its report for hang-b's, which names rank 1 and
// its host with the stacks collected there: both hosts show that one.
class HangMultiHost : public NetnsTest {};

TEST_F(HangMultiHost, AStoppedRankOnTheSecondHostIsNamedWithItsHostAndStack) {
  NetnsHosts hosts(2);
  const std::vector<std::string> names = {"hang-a", "hang-b"};
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int h = 0; h < 2; ++h) {
    // A host of its own name (UTS namespace), as a real machine has.
    nodes.push_back(std::make_unique<Subprocess>(
        hosts.on(h, {"unshare", "--uts", "sh", "-c", "hostname \"$0\"; exec \"$@\"", names[h],
                     kDdprun, "--nnodes=2", "--node_rank=" + std::to_string(h),
                     "--master_addr=" + hosts.address(0), "--master_port=29500",
                     "--nproc_per_node=1", "--hang_timeout=2", kCollectiveWorker, "stop"}),
        std::map<std::string, std::string>{{"DDP_BACKEND", "gloo"},
                                           {"GLOO_SOCKET_IFNAME", "eth0"}}));
  }
  std::vector<ProcessResult> r;
  for (auto& node : nodes) r.push_back(node->wait(60s));
  const std::string named = "rank 1 (local rank 0, pid ";
  const std::string doing = "rank 1: stopped (SIGSTOP or a debugger), between collectives (3 done)";
  for (int h = 0; h < 2; ++h) {
    ASSERT_TRUE(r[h].exited) << names[h] << "\n" << r[h].err;
    EXPECT_NE(r[h].err.find(doing), std::string::npos) << names[h] << "\n" << r[h].err;
    EXPECT_NE(r[h].err.find(", host hang-b)"), std::string::npos) << names[h] << "\n" << r[h].err;
    EXPECT_NE(r[h].err.find("rank 1, native stacks:"), std::string::npos) << names[h] << "\n"
                                                                          << r[h].err;
  }
  EXPECT_EQ(r[1].code, 124) << r[1].err;  // the hang's own exit code, where it was found
  EXPECT_NE(r[0].code, 0) << r[0].err;
  // hang-a took that report instead of blaming its own waiting rank (it
  // found the hang first and waited for it, or the report came first).
  EXPECT_NE(r[0].err.find("round 1 ended on another node: "), std::string::npos) << r[0].err;
  EXPECT_EQ(r[0].err.find("rank 0: uses no CPU, in all_reduce #4"), std::string::npos) << r[0].err;
  EXPECT_LT(r[0].seconds, 30.0) << r[0].err;
}
}  // namespace
}  // namespace ddp::testing
