// Which peers of a group are gone, as the NCCL and Gloo backends' waits ask it
// (core/peer_watch.h): the ranks of this node are watched through their pids
// once their "proc/<rank>" key is there (others are not); the first rank
// that aborted the group is named.

#include "core/peer_watch.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/process_identity.h"
#include "ddp/process_group.h"
#include "ddp/store.h"
#include "zombie.h"

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

// A clock the test moves by hand.
struct FakeClock {
  PeerWatch::Clock::time_point at{};
  std::function<PeerWatch::Clock::time_point()> fn() {
    return [this] { return at; };
  }
  void pass(std::chrono::milliseconds by) { at += by; }
};

// This process's identity with another pid: a process on this machine.
std::string here(pid_t pid) {
  const std::string mine = process_identity();
  return mine.substr(0, mine.rfind(' ') + 1) + std::to_string(pid);
}

TEST(PeerWatch, NamesARankOfThisNodeOnceItsProcessExited) {
  if (pid_namespace_of(process_identity()).empty()) GTEST_SKIP() << "no /proc identity here";
  const auto store = make_memory_store();
  const pid_t one = sleeper(), other = sleeper();
  ASSERT_GT(one, 0);
  ASSERT_GT(other, 0);
  FakeClock clock;
  PeerWatch watch(store, 0, 0, 3, nullptr, std::nullopt,
                  clock.fn());                    // rank 0 of a node of ranks 0-2, in a world of 6
  EXPECT_EQ(watch.first_exited(), std::nullopt);  // no key yet: nothing known, nothing dead
  store->set("proc/1", here(one));
  // Rank 2 runs in another PID namespace (a container): its pid means
  // nothing here. Rank 4 is on another node: not this watch's to read.
  store->set("proc/2", "another-boot/pid:[1] " + std::to_string(other));
  store->set("proc/4", here(other));
  ::kill(one, SIGKILL);
  EXPECT_EQ(watch.first_exited(), std::nullopt);  // missing keys are asked again after 200 ms
  clock.pass(200ms);
  ::waitpid(one, nullptr, 0);
  EXPECT_EQ(watch.first_exited(), "rank 1 (pid " + std::to_string(one) + ") exited");
  ::kill(other, SIGKILL);
  ::waitpid(other, nullptr, 0);
}

TEST(PeerWatch, ANodesRankIsWatchedOnceItsKeyIsThereAndAZombieIsGone) {
  if (pid_namespace_of(process_identity()).empty()) GTEST_SKIP() << "no /proc identity here";
  const auto store = make_memory_store();
  const pid_t one = sleeper(), other = sleeper();
  ASSERT_GT(one, 0);
  ASSERT_GT(other, 0);
  store->set("proc/1", here(one));
  store->set("proc/2", "another-boot/pid:[1] " + std::to_string(other));
  store->set("proc/4", here(other));
  PeerWatch watch(store, 0, 0, 3);
  EXPECT_EQ(watch.first_exited(), std::nullopt);
  ::kill(other, SIGKILL);
  ::waitpid(other, nullptr, 0);
  EXPECT_EQ(watch.first_exited(), std::nullopt);
  ::kill(one, SIGKILL);  // a zombie, not yet reaped, is gone too
  ASSERT_TRUE(testing::wait_until_zombie(one));
  EXPECT_EQ(watch.first_exited(), "rank 1 (pid " + std::to_string(one) + ") exited");
  ::waitpid(one, nullptr, 0);
}

TEST(PeerWatch, NamesTheFirstRankThatLeftTheGroupByAbortingIt) {
  const auto store = make_memory_store();
  const auto options = ProcessGroupOptions::of("local");
  auto rank0 = ProcessGroup::create(0, 3, store, options);
  auto rank2 = ProcessGroup::create(2, 3, store, options);
  PeerWatch watch(store, 1, 0, 3);
  EXPECT_EQ(watch.first_left(), std::nullopt);
  rank2->abort();
  EXPECT_EQ(watch.first_left(), "rank 2 left the group");
  rank0->abort();
  EXPECT_EQ(watch.first_left(), "rank 2 left the group");
}

// gone(rank), as the Gloo backend's long waits ask it: an exited rank of
// this node at once; any rank, once some rank left the group (the store is
// asked at most every 200 ms).
TEST(PeerWatch, SaysWhyARankCanNoLongerTakePart) {
  if (pid_namespace_of(process_identity()).empty()) GTEST_SKIP() << "no /proc identity here";
  const auto store = make_memory_store();
  const pid_t one = sleeper();
  ASSERT_GT(one, 0);
  store->set("proc/1", here(one));
  FakeClock clock;
  PeerWatch watch(store, 0, 0, 2, nullptr, std::nullopt, clock.fn());
  EXPECT_EQ(watch.gone(1), std::nullopt);
  EXPECT_EQ(watch.gone(5), std::nullopt);  // another node's rank: alive as far as we know
  auto rank3 = ProcessGroup::create(3, 6, store, ProcessGroupOptions::of("local"));
  rank3->abort();
  EXPECT_EQ(watch.gone(5), std::nullopt);  // the store was asked less than 200 ms ago
  clock.pass(200ms);
  EXPECT_EQ(watch.gone(5), "rank 3 left the group");
  ::kill(one, SIGKILL);
  ::waitpid(one, nullptr, 0);
  EXPECT_EQ(watch.gone(1), "rank 1 (pid " + std::to_string(one) + ") exited");
}

// The Gloo backend's watch asks only of waits already long, so it asks the
// store for departures every 20 ms instead of every 200.
TEST(PeerWatch, TheStoreIsAskedOfDeparturesAsOftenAsSet) {
  const auto store = make_memory_store();
  FakeClock clock;
  PeerWatch watch(store, 0, 0, 1, nullptr, std::nullopt, clock.fn());
  watch.set_departure_spacing(20ms);
  EXPECT_EQ(watch.gone(5), std::nullopt);
  auto rank3 = ProcessGroup::create(3, 6, store, ProcessGroupOptions::of("local"));
  rank3->abort();
  clock.pass(19ms);
  EXPECT_EQ(watch.gone(5), std::nullopt);  // asked 19 ms ago
  clock.pass(1ms);
  EXPECT_EQ(watch.gone(5), "rank 3 left the group");
}

// An inner group (the shm backend's Gloo group across nodes) has a prefixed
// store of its own: its pids are there, while departures are counted in the
// enclosing ProcessGroup's store, which is the one asked.
TEST(PeerWatch, AnInnerGroupLearnsOfDeparturesFromTheEnclosingGroupsStore) {
  const auto outer = make_memory_store();
  const auto inner = make_prefix_store(outer, "inner");
  FakeClock clock;
  PeerWatch watch(inner, 0, 0, 1, outer, std::nullopt, clock.fn());
  EXPECT_EQ(watch.gone(1), std::nullopt);
  auto rank2 = ProcessGroup::create(2, 3, outer, ProcessGroupOptions::of("local"));
  rank2->abort();  // leaves the enclosing group: counted in `outer`
  clock.pass(200ms);
  EXPECT_EQ(watch.gone(1), "rank 2 left the group");
  EXPECT_EQ(inner->add("left_count", 0), 0);  // nothing was ever counted in the inner store
}

TEST(PeerWatch, AGroupWithoutAStoreWatchesNobody) {
  PeerWatch watch(nullptr, 0, 0, 3);
  EXPECT_EQ(watch.first_exited(), std::nullopt);
  EXPECT_EQ(watch.first_left(), std::nullopt);
  EXPECT_EQ(watch.gone(1), std::nullopt);
}

// What the shm backend's waits and a ProcessWatch without a pidfd ask: a
// running process is not dead, a zombie is (it can do nothing more), and so
// is a reaped one.
TEST(PeerWatch, ProcessExitedOfARunningAZombieAndAReapedProcess) {
  const pid_t pid = sleeper();
  ASSERT_GT(pid, 0);
  EXPECT_FALSE(process_exited(pid));
  EXPECT_FALSE(process_exited(::getpid()));
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  ASSERT_TRUE(testing::wait_until_zombie(pid));
  EXPECT_TRUE(process_exited(pid)) << "a zombie is dead";
  ::waitpid(pid, nullptr, 0);
  EXPECT_TRUE(process_exited(pid)) << "a reaped process is dead";
}

}  // namespace
}  // namespace ddp::detail
