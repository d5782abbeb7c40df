// Daemons a worker starts the usual way (setsid in a child that is left
// behind: a new session and process group, parent gone) never outlive the
// job: while ddprun runs, it is their subreaper and stops what it adopted;
// when ddprun itself is SIGKILLed, its guard finds them by the tag their
// environment inherited (OrphanGuard::kTagVariable) and kills them.

#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "subprocess.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
const std::string kDdprun = DDPRUN_PATH;

// A shell script for each rank: start a daemon that writes its pid to
// DIR/daemon_<rank>, wait until both ranks' daemons exist, then `ending`.
std::string daemon_script(const std::string& dir, const std::string& ending) {
  return "( setsid sh -c 'echo $$ > " + dir + "/d$RANK.tmp; mv " + dir + "/d$RANK.tmp " + dir +
         "/daemon_$RANK; exec sleep 300' & ); until [ -e " + dir + "/daemon_0 ] && [ -e " + dir +
         "/daemon_1 ]; do sleep 0.01; done; " + ending;
}

void expect_gone(const std::set<pid_t>& daemons, const std::string& why) {
  for (pid_t pid : daemons) {
    EXPECT_TRUE(wait_until([&] { return !process_alive(pid); }, 5s))
        << "daemon " << pid << " outlived the job\n"
        << why;
    kill(pid, SIGKILL);
  }
}

TEST(DaemonCleanup, ADaemonThatLeftTheWorkersSessionIsStoppedWithTheJob) {
  for (const std::string ending : {"exit 0", "exit 3"}) {
    const std::string dir = make_temp_dir();
    auto r = run_process({kDdprun, "--nproc_per_node=2", "sh", "-c", daemon_script(dir, ending)},
                         {}, 30s);
    EXPECT_EQ(r.code, ending == "exit 0" ? 0 : 3) << r.err;
    const std::set<pid_t> daemons = read_pids(dir, "daemon_");
    ASSERT_EQ(daemons.size(), 2u) << r.err;
    expect_gone(daemons, r.err);
    EXPECT_NE(r.err.find("process(es) the workers left outside their process groups"),
              std::string::npos)
        << r.err;
  }
}

TEST(DaemonCleanup, ADaemonOutlivesNoSigkilledDdprun) {
  const std::string dir = make_temp_dir();
  Subprocess p({kDdprun, "--nproc_per_node=2", "sh", "-c", daemon_script(dir, "sleep 300")});
  ASSERT_TRUE(wait_until([&] { return read_pids(dir, "daemon_").size() == 2; }, 10s))
      << p.read_err();
  const std::set<pid_t> daemons = read_pids(dir, "daemon_");
  kill(p.pid(), SIGKILL);  // no teardown of its own: the guard is all that is left
  p.wait(5s);
  expect_gone(daemons, p.read_err());
}

// ddprun's child named ddprun-guard (its orphan guard); 0 when none.
pid_t guard_of(pid_t ddprun) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat"), comm(entry.path() / "comm");
    std::string text, name;
    if (!std::getline(stat, text) || !std::getline(comm, name)) continue;  // gone meanwhile
    // "pid (comm) state ppid ...": the parent follows the state after the last ')'.
    std::istringstream rest(text.substr(text.rfind(')') + 1));
    char state = 0;
    pid_t parent = 0;
    if (rest >> state >> parent && parent == ddprun && name == "ddprun-guard")
      return std::stoi(pid);
  }
  return 0;
}

TEST(DaemonCleanup, AKilledGuardIsReplacedAndADaemonStillOutlivesNoSigkilledDdprun) {
  const std::string dir = make_temp_dir();
  Subprocess p({kDdprun, "--nproc_per_node=2", "sh", "-c", daemon_script(dir, "sleep 300")});
  ASSERT_TRUE(wait_until([&] { return read_pids(dir, "daemon_").size() == 2; }, 10s))
      << p.read_err();
  const pid_t guard = guard_of(p.pid());
  ASSERT_GT(guard, 0) << "no ddprun-guard child of ddprun";
  kill(guard, SIGKILL);
  ASSERT_TRUE(wait_until(
      [&] { return p.read_err().find("started another (pid") != std::string::npos; }, 10s))
      << p.read_err();
  EXPECT_NE(
      p.read_err().find("orphan guard (pid " + std::to_string(guard) + ") was killed by SIGKILL"),
      std::string::npos)
      << p.read_err();
  // The new guard names itself right after its fork: wait for the name.
  pid_t replacement = 0;
  ASSERT_TRUE(wait_until(
      [&] {
        replacement = guard_of(p.pid());
        return replacement > 0 && replacement != guard;
      },
      5s))
      << "no new ddprun-guard child of ddprun\n"
      << p.read_err();
  const std::set<pid_t> daemons = read_pids(dir, "daemon_");
  kill(p.pid(), SIGKILL);  // the new guard must know the workers' groups and tag
  p.wait(5s);
  expect_gone(daemons, p.read_err());
}

// The tag follows nesting: a ddprun inside a worker keeps the outer job's
// tag in its own workers' environment, beside its own.
TEST(DaemonCleanup, WorkersCarryTheGuardsTagAfterAnOuterOne) {
  const std::string outer =
      "printf 'outer %s\\n' \"$DDP_AGENT_TAGS\"; " + kDdprun +
      " --nproc_per_node=1 --no_prefix sh -c 'printf \"inner %s\\n\" \"$DDP_AGENT_TAGS\"'";
  auto r = run_process({kDdprun, "--nproc_per_node=1", "--no_prefix", "sh", "-c", outer}, {}, 30s);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto outer_tags = lines_with_prefix(r.out, "outer ");
  const auto inner_tags = lines_with_prefix(r.out, "inner ");
  ASSERT_EQ(outer_tags.size(), 1u) << r.out;
  ASSERT_EQ(inner_tags.size(), 1u) << r.out;
  EXPECT_EQ(outer_tags[0].size(), 16u) << r.out;  // one tag of 16 hex digits
  EXPECT_EQ(inner_tags[0].rfind(outer_tags[0] + ":", 0), 0u) << r.out;
  EXPECT_EQ(inner_tags[0].size(), 33u) << r.out;
}

}  // namespace
}  // namespace ddp::testing
