#include "ddp/common/shm_names.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "zombie.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;
using ::ddp::testing::wait_until_zombie;

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.rfind(prefix, 0) == 0;
}

// The pid of a process that has exited (and been reaped): the run's sweep
// removes its files, as it keeps those of a running one.
long dead_pid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  if (child < 0 || waitpid(child, nullptr, 0) != child) std::abort();
  return child;
}

// This process's PID namespace as names write it.
std::string own_ns() { return std::to_string(pid_namespace_id()); }

// A fresh directory standing in for /dev/shm; removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string templ = (fs::temp_directory_path() / "ddp-shm-names-XXXXXX").string();
    if (mkdtemp(templ.data()) == nullptr) std::abort();
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  void touch(const std::string& name) const { std::ofstream(path_ + "/" + name) << "x"; }
  std::set<std::string> names() const {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(path_)) out.insert(e.path().filename().string());
    return out;
  }

 private:
  std::string path_;
};

TEST(ShmNames, ThePidNamespaceIdIsTheInodeNumberProcShows) {
  char link[64] = {};
  ASSERT_GT(readlink("/proc/self/ns/pid", link, sizeof link - 1), 0);
  EXPECT_EQ("pid:[" + std::to_string(pid_namespace_id()) + "]", link);
}

TEST(ShmNames, PrefixAndSegmentNameFormat) {
  EXPECT_EQ(shm_run_prefix("job42"), "ddp-job42-");
  EXPECT_EQ(shm_segment_name("job42", 3, "default", 1, 77, "ab12"),
            "/ddp-job42-r3-default-n1-p77i" + own_ns() + "-ab12");
  // '_' doubles, other characters outside [A-Za-z0-9.] become '_' and hex:
  // no '/' inside a name, no '-' inside the id, and distinct ids stay distinct.
  EXPECT_EQ(shm_run_prefix("a-b/c d"), "ddp-a_2db_2fc_20d-");
  EXPECT_EQ(shm_run_prefix("a_b"), "ddp-a__b-");
  EXPECT_EQ(shm_segment_name("r", 0, "my group", 0, 5, "u/v"),
            "/ddp-r-r0-my_20group-n0-p5i" + own_ns() + "-u_2fv");
}

TEST(ShmNames, NoRunsPrefixMatchesAnotherRunsSegments) {
  // "a" must not clean up after "a-b" (nor "a-b" after "a"), etc.
  const std::vector<std::string> ids = {"a",   "a-b",   "a_b", "a__b", "a_2db", "ab",
                                        "a.b", "a-b-c", "A",   "r1",   "a-r1"};
  for (const auto& x : ids) {
    for (const auto& y : ids) {
      const std::string segment = shm_segment_name(y, 1, "default", 0, 1, "u").substr(1);
      EXPECT_EQ(starts_with(segment, shm_run_prefix(x)), x == y)
          << "run '" << x << "' vs segment of '" << y << "'";
    }
  }
}

TEST(ShmNames, LongIdsStayUnderNameMaxAndStayDistinct) {
  const std::string long_a(1000, 'a');
  const std::string long_b = std::string(999, 'a') + "b";  // same sanitised start, different id
  EXPECT_LT(shm_run_prefix(long_a).size(), 255u);
  EXPECT_NE(shm_run_prefix(long_a), shm_run_prefix(long_b));
  EXPECT_FALSE(starts_with(shm_run_prefix(long_b), shm_run_prefix(long_a)));
  const std::string name = shm_segment_name(long_a, 1234567890123L, std::string(500, 'g'), 65535,
                                            1L << 30, std::string(300, 'f'));
  ASSERT_EQ(name[0], '/');
  EXPECT_LE(name.size() - 1, static_cast<size_t>(NAME_MAX)) << name;
  EXPECT_TRUE(starts_with(name.substr(1), shm_run_prefix(long_a)));
  // Deterministic: the launcher and the workers compute the same prefix.
  EXPECT_EQ(shm_run_prefix(long_a), shm_run_prefix(std::string(1000, 'a')));
}

TEST(ShmNames, RemoveRunSegmentsRemovesOnlyThatRunsFiles) {
  TempDir dir;
  const std::string run = "a";
  const long dead = dead_pid();
  const std::vector<std::string> mine = {
      shm_segment_name(run, 1, "default", 0, dead, "x").substr(1),
      shm_segment_name(run, 2, "default", 1, dead, "y").substr(1)};
  const std::vector<std::string> others = {
      shm_segment_name("a-b", 1, "default", 0, dead, "x").substr(1),
      shm_segment_name("ab", 1, "default", 0, dead, "x").substr(1),
      "ddp-a",  // no '-' after the id: not a segment of "a"
      "other-file", "sem.ddp-a-r1"};
  for (const auto& n : mine) dir.touch(n);
  for (const auto& n : others) dir.touch(n);
  EXPECT_EQ(remove_run_segments(run, dir.path()), 2);
  EXPECT_EQ(dir.names(), std::set<std::string>(others.begin(), others.end()));
  EXPECT_EQ(remove_run_segments(run, dir.path()), 0);  // nothing left to remove
}

TEST(ShmNames, ArenaNamesArePerProcessAndTheRunsSweepTakesThem) {
  EXPECT_EQ(shm_arena_name("job42", 123, "ab"), "/ddp-job42-arena-p123i" + own_ns() + "-ab");
  EXPECT_EQ(shm_arena_heir_name("job42", 3), "/ddp-job42-arena-heir-r3i" + own_ns());
  // pid 12's prefix is not pid 123's; every arena is one of its run's files.
  EXPECT_FALSE(
      starts_with(shm_arena_name("job42", 123, "ab").substr(1), shm_arena_prefix("job42", 12)));
  EXPECT_TRUE(starts_with(shm_arena_heir_name("job42", 3).substr(1), shm_run_prefix("job42")));
  TempDir dir;
  dir.touch(shm_arena_name("job42", dead_pid(), "ab").substr(1));
  EXPECT_EQ(remove_run_segments("job42", dir.path()), 1);
}

TEST(ShmNames, TheRunsSweepKeepsTheArenaAndStateMemoryOfAProcessStillRunning) {
  // Another ddprun of the run on this machine (two nodes on one host, or
  // test hosts in network namespaces) may still use them; a dead process's
  // go, and so do the names that only look like a process's.
  TempDir dir;
  const long live = getpid(), dead = dead_pid();
  const std::set<std::string> kept = {shm_arena_name("job42", live, "ab").substr(1),
                                      shm_state_name("job42", live, "cd").substr(1)};
  for (const std::string& name : kept) dir.touch(name);
  dir.touch(shm_arena_name("job42", dead, "ab").substr(1));
  dir.touch(shm_state_name("job42", dead, "cd").substr(1));
  dir.touch(shm_arena_heir_name("job42", 1).substr(1));
  dir.touch("ddp-job42-arena-p-x");
  dir.touch("ddp-job42-state-p" + std::to_string(live) + "x");
  dir.touch("ddp-job42-arena-p99999999999999999999-x");
  EXPECT_EQ(remove_run_segments("job42", dir.path()), 6);
  EXPECT_EQ(dir.names(), kept);
}

TEST(ShmNames, TheRunsSweepKeepsTheSegmentsOfACreatorStillRunningButNotAZombiesOrADeadOnes) {
  // Two agents of one run on one host: one agent's sweep at the end of its
  // attempt must not take a segment the other's local rank 0 is setting up.
  TempDir dir;
  const long live = getpid(), dead = dead_pid();
  const pid_t zombie = fork();
  if (zombie == 0) _exit(0);
  ASSERT_GT(zombie, 0);
  ASSERT_TRUE(wait_until_zombie(zombie));
  const std::string kept = shm_segment_name("job42", 3, "my group", 1, live, "ab").substr(1);
  dir.touch(kept);
  dir.touch(shm_segment_name("job42", 3, "my group", 1, dead, "cd").substr(1));
  dir.touch(shm_segment_name("job42", 4, "default", 0, zombie, "ef").substr(1));
  dir.touch(shm_arena_name("job42", zombie, "gh").substr(1));
  // Names that only look like a segment's go too (an older ddprun's, say).
  dir.touch("ddp-job42-r3-default-n1-" + std::to_string(live));
  dir.touch("ddp-job42-r3-default-n1-x" + std::to_string(live) + "-ab");
  dir.touch("ddp-job42-r-default-n1-p" + std::to_string(live) + "-ab");
  dir.touch("ddp-job42-r3-default-m1-p" + std::to_string(live) + "-ab");
  EXPECT_EQ(remove_run_segments("job42", dir.path()), 7);
  EXPECT_EQ(dir.names(), std::set<std::string>{kept});
  waitpid(zombie, nullptr, 0);
}

TEST(ShmNames, ADeadProcesssArenaAndStateMemoryPassToTheHeirOfItsRank) {
  TempDir dir;
  const long pid = dead_pid(), other_pid = dead_pid();
  const std::string dead = shm_arena_name("job42", pid, "ab").substr(1);
  const std::string dead_state = shm_state_name("job42", pid, "ef").substr(1);
  const std::string other = shm_arena_name("job42", other_pid, "cd").substr(1);
  const std::string heir = shm_arena_heir_name("job42", 2).substr(1);
  const std::string state_heir = shm_state_heir_name("job42", 2).substr(1);
  EXPECT_EQ(shm_state_name("job42", 123, "ef"), "/ddp-job42-state-p123i" + own_ns() + "-ef");
  EXPECT_EQ(state_heir, "ddp-job42-state-heir-r2i" + own_ns());
  dir.touch(dead);
  dir.touch(dead_state);
  dir.touch(other);
  EXPECT_EQ(pass_carried_memory_to_heir("job42", pid, 2, dir.path()), 2);
  EXPECT_EQ(dir.names(), (std::set<std::string>{heir, state_heir, other}));
  // An heir nobody took over is replaced by the next one; a process with an
  // arena but no state memory passes the arena alone.
  EXPECT_EQ(pass_carried_memory_to_heir("job42", other_pid, 2, dir.path()), 1);
  EXPECT_EQ(dir.names(), (std::set<std::string>{heir, state_heir}));
  EXPECT_EQ(pass_carried_memory_to_heir("job42", 99, 2, dir.path()), 0) << "pid 99 made none";
  EXPECT_EQ(pass_carried_memory_to_heir("job42", 99, 2, "/nonexistent/ddp-shm-names-test"), 0);
  // The run's sweep takes state memory too.
  EXPECT_EQ(remove_run_segments("job42", dir.path()), 2);
}

TEST(ShmNames, TheRunsSweepLeavesTheFilesOfAnotherPidNamespace) {
  // A container sharing this machine's /dev/shm but not its pids: its pid
  // numbers say nothing here, so none of its files is taken, even where the
  // same number is a dead process here; a name that only looks like one goes.
  TempDir dir;
  const long dead = dead_pid();
  const std::string other = std::to_string(pid_namespace_id() + 1);
  const std::set<std::string> kept = {
      "ddp-job42-arena-p" + std::to_string(dead) + "i" + other + "-ab",
      "ddp-job42-state-p" + std::to_string(dead) + "i" + other + "-cd",
      "ddp-job42-r3-default-n1-p" + std::to_string(dead) + "i" + other + "-ef",
      "ddp-job42-arena-heir-r2i" + other, "ddp-job42-state-heir-r2i" + other};
  for (const std::string& name : kept) dir.touch(name);
  dir.touch(shm_arena_name("job42", dead, "ab").substr(1));
  dir.touch(shm_segment_name("job42", 3, "default", 1, dead, "ef").substr(1));
  dir.touch(shm_arena_heir_name("job42", 2).substr(1));
  dir.touch(shm_state_heir_name("job42", 2).substr(1));
  dir.touch("ddp-job42-arena-p" + std::to_string(dead) + "i-ab");  // no namespace after 'i'
  dir.touch("ddp-job42-state-heir-r2i" + other + "x");
  EXPECT_EQ(remove_run_segments("job42", dir.path()), 6);
  EXPECT_EQ(dir.names(), kept);
}

// Runs `inner` in a process of a new PID namespace (its pid 1) and returns
// its exit code; -1 where this process may not make one (not root).
int in_new_pid_namespace(const std::function<int()>& inner) {
  const pid_t outer = fork();
  if (outer == 0) {
    if (unshare(CLONE_NEWPID) != 0) _exit(255);
    const pid_t first = fork();  // the new namespace's first process
    if (first == 0) _exit(inner());
    int status = 0;
    if (first < 0 || waitpid(first, &status, 0) != first || !WIFEXITED(status)) _exit(254);
    _exit(WEXITSTATUS(status));
  }
  int status = 0;
  if (outer < 0 || waitpid(outer, &status, 0) != outer || !WIFEXITED(status)) return 254;
  return WEXITSTATUS(status) == 255 ? -1 : WEXITSTATUS(status);
}

TEST(ShmNames, TwoPidNamespacesSharingADirectoryEachSweepOnlyTheirOwn) {
  // One pid number, dead in both namespaces: each sweep takes its own
  // namespace's file of it and leaves the other's, and keeps a file whose
  // creator runs in the other namespace.
  TempDir dir;
  const long dead = dead_pid();
  const std::string outer_file = shm_arena_name("job42", dead, "outer").substr(1);
  dir.touch(outer_file);
  std::string inner_live;
  const int removed_inside = in_new_pid_namespace([&] {
    if (getpid() != 1) return 253;
    dir.touch(shm_arena_name("job42", dead, "inner").substr(1));
    dir.touch(shm_state_name("job42", getpid(), "live").substr(1));  // this process, running
    return remove_run_segments("job42", dir.path());
  });
  if (removed_inside < 0) GTEST_SKIP() << "unshare(CLONE_NEWPID) is not allowed here (not root)";
  EXPECT_EQ(removed_inside, 1) << "inside: its dead creator's file only";
  const std::set<std::string> left = dir.names();
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left.count(outer_file), 1u);
  // Its creator (pid 1 there) is gone now, but that namespace's to sweep.
  EXPECT_EQ(remove_run_segments("job42", dir.path()), 1);
  EXPECT_EQ(dir.names().count(outer_file), 0u);
  EXPECT_EQ(dir.names().size(), 1u);
}

TEST(ShmNames, RemoveRunSegmentsOnAMissingDirectoryRemovesNothing) {
  EXPECT_EQ(remove_run_segments("a", "/nonexistent/ddp-shm-names-test"), 0);
}

TEST(ShmNames, RealSegmentWithALongRunIdIsCreatedAndRemoved) {
  const std::string run = std::string(400, 'z') + "-" + std::to_string(getpid());
  const std::string name = shm_segment_name(run, 7, "default", 0, dead_pid(), "unit");
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0) << name;
  close(fd);
  EXPECT_EQ(remove_run_segments(run), 1);
  EXPECT_LT(shm_open(name.c_str(), O_RDWR, 0600), 0);  // gone
}

}  // namespace
}  // namespace ddp
