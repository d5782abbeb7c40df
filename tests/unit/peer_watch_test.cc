// Which ranks of a group have exited, as the NCCL backend's waits ask it
// (core/peer_watch.h): ranks on this machine are watched through their pids
// once their "proc/<rank>" key is there; ranks elsewhere are not.

#include "core/peer_watch.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ddp/process_group.h"
#include "ddp/store.h"

namespace ddp::detail {
namespace {

using namespace std::chrono_literals;

// A child process that sleeps until killed.
pid_t sleeper() {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::pause();
    ::_exit(0);
  }
  return pid;
}

// This process's identity with another pid: a process on this machine.
std::string here(pid_t pid) {
  const std::string mine = process_identity();
  return mine.substr(0, mine.rfind(' ') + 1) + std::to_string(pid);
}

TEST(PeerWatch, NamesARankOnThisMachineOnceItsProcessExitedAndIgnoresOthersElsewhere) {
  if (pid_namespace_of(process_identity()).empty()) GTEST_SKIP() << "no /proc identity here";
  const auto store = make_memory_store();
  const pid_t one = sleeper(), three = sleeper();
  ASSERT_GT(one, 0);
  ASSERT_GT(three, 0);
  PeerWatch watch(store, 0, 4);
  EXPECT_EQ(watch.first_exited(), std::nullopt);  // no key yet: nothing known, nothing dead
  store->set("proc/1", here(one));
  // Rank 2 runs on another machine: its pid (this test's own child's, dead
  // below) means nothing here.
  store->set("proc/2", "another-boot/pid:[1] " + std::to_string(three));
  EXPECT_EQ(watch.first_exited(), std::nullopt);
  store->set("proc/3", here(three));
  ::kill(three, SIGKILL);
  ::waitpid(three, nullptr, 0);
  EXPECT_EQ(watch.first_exited(), "rank 3 (pid " + std::to_string(three) + ") exited");
  ::kill(one, SIGKILL);  // a zombie, not yet reaped, is gone too
  siginfo_t info{};
  ::waitid(P_PID, static_cast<id_t>(one), &info, WEXITED | WNOWAIT);
  EXPECT_EQ(watch.first_exited(), "rank 1 (pid " + std::to_string(one) + ") exited");
  ::waitpid(one, nullptr, 0);
}

TEST(PeerWatch, NamesARankThatLeftTheGroupAsProcessGroupAbortMarksIt) {
  const auto store = make_memory_store();
  PeerWatch watch(store, 1, 3);
  EXPECT_EQ(watch.first_left(), std::nullopt);
  // What ProcessGroup::abort() writes: this rank's own mark is not a peer's.
  store->set("left/1", "1");
  store->add("left_count", 1);
  EXPECT_EQ(watch.first_left(), std::nullopt);
  store->set("left/2", "1");
  store->add("left_count", 1);
  EXPECT_EQ(watch.first_left(), "rank 2 left the group");
}

TEST(PeerWatch, AbortingAGroupMarksItsRankAsLeft) {
  const auto store = make_memory_store();
  auto group = ProcessGroup::create(0, 2, store, ProcessGroupOptions::of("local"));
  group->abort();
  PeerWatch watch(store, 1, 2);
  EXPECT_EQ(watch.first_left(), "rank 0 left the group");
}

TEST(PeerWatch, AGroupWithoutAStoreWatchesNobody) {
  PeerWatch watch(nullptr, 0, 3);
  EXPECT_EQ(watch.first_exited(), std::nullopt);
  EXPECT_EQ(watch.first_left(), std::nullopt);
}

}  // namespace
}  // namespace ddp::detail
