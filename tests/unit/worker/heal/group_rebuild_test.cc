// A process group made from a member set, aborted, and made again over a new
// set in the same process (what live recovery stands on), and asked whether
// its peers are still there, with every rank a thread: real shm and Gloo
// backends over one in-memory store.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/process_identity.h"
#include "ddp/common/error.h"
#include "ddp/process_group.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

MemberSet set_of(std::uint64_t epoch, std::vector<int> ids) {
  MemberSet set;
  set.epoch = epoch;
  for (int id : ids) set.members.push_back({id, 0});
  return set;
}

ProcessGroupOptions options_for(const std::string& backend) {
  ProcessGroupOptions o = ProcessGroupOptions::of(backend);
  o.timeout = 20s;
  o.run_id = "rebuild" + std::to_string(::getpid());
  return o;
}

// Makes the group of `set` on one thread per member; returns them by rank.
std::vector<std::shared_ptr<ProcessGroup>> make_groups(const MemberSet& set,
                                                       const std::shared_ptr<Store>& store,
                                                       const ProcessGroupOptions& options) {
  std::vector<std::future<std::shared_ptr<ProcessGroup>>> made;
  for (const Member& m : set.members) {
    made.push_back(std::async(std::launch::async, [&, id = m.id] {
      return ProcessGroup::create(set, id, store, options);
    }));
  }
  std::vector<std::shared_ptr<ProcessGroup>> groups;
  for (auto& f : made) groups.push_back(f.get());
  return groups;
}

// Every member all-reduces its id + 1; each must see the sum over the set.
void expect_sum_of_members(std::vector<std::shared_ptr<ProcessGroup>>& groups,
                           const MemberSet& set) {
  double expected = 0;
  for (const Member& m : set.members) expected += m.id + 1;
  std::vector<std::future<double>> sums;
  for (std::size_t r = 0; r < groups.size(); ++r) {
    sums.push_back(std::async(std::launch::async, [&, r] {
      double value = set.members[r].id + 1;
      groups[r]->all_reduce(&value, 1, DType::kFloat64);
      return value;
    }));
  }
  for (auto& s : sums) EXPECT_EQ(s.get(), expected);
}

class GroupRebuild : public ::testing::TestWithParam<std::string> {};

TEST_P(GroupRebuild, ShrinksOnAbortAndGrowsBackInTheSameProcess) {
  auto store = make_memory_store();
  const auto options = options_for(GetParam());
  const MemberSet e0 = set_of(0, {0, 1, 2});
  auto groups = make_groups(e0, store, options);
  expect_sum_of_members(groups, e0);
  EXPECT_EQ(groups[2]->epoch(), 0u);
  EXPECT_EQ(groups[1]->members().members, e0.members);

  // Members 0 and 1 wait in a collective member 2 never joins; member 2
  // leaves (abort, then its group goes): both fail well before the timeout.
  // As the Healer does, a member whose collective failed leaves at once too,
  // so one still waiting on it (a ring's neighbour) is freed.
  const auto t0 = Clock::now();
  std::vector<std::future<std::string>> failed;
  for (int r : {0, 1}) {
    failed.push_back(std::async(std::launch::async, [&, r]() -> std::string {
      double value = 1;
      try {
        groups[r]->all_reduce(&value, 1, DType::kFloat64);
      } catch (const Error& e) {
        groups[r]->abort();
        return e.what();
      }
      return "";
    }));
  }
  std::this_thread::sleep_for(50ms);
  groups[2]->abort();
  groups[2].reset();
  for (auto& f : failed) EXPECT_NE(f.get(), "") << "a collective must fail when a member leaves";
  // shm: the leaver's mark wakes them; Gloo: its connections shut down.
  EXPECT_LT(Clock::now() - t0, 2s) << "survivors must not wait for the timeout";
  for (int r : {0, 1}) {
    groups[r]->abort();
    EXPECT_TRUE(groups[r]->aborted());
    double value = 1;
    EXPECT_THROW(groups[r]->all_reduce(&value, 1, DType::kFloat64), Error);
  }
  groups.clear();

  const MemberSet e1 = set_of(1, {0, 1});
  auto survivors = make_groups(e1, store, options);
  EXPECT_EQ(survivors[1]->rank(), 1);
  EXPECT_EQ(survivors[1]->size(), 2);
  EXPECT_EQ(survivors[0]->epoch(), 1u);
  expect_sum_of_members(survivors, e1);
  survivors.clear();

  const MemberSet e2 = set_of(2, {0, 1, 2});
  auto grown = make_groups(e2, store, options);
  expect_sum_of_members(grown, e2);
}

// A member of the set that never connects (it died after it arrived): with
// a connect_timeout the others' creation fails within it, not after the
// collective timeout (20 s here).
TEST_P(GroupRebuild, AMemberThatNeverConnectsFailsTheCreationWithinTheConnectTimeout) {
  const auto store = make_memory_store();
  const MemberSet set = set_of(3, {0, 1, 2});
  ProcessGroupOptions options = options_for(GetParam());
  options.run_id += "-lost";
  options.connect_timeout = 500ms;
  const auto start = Clock::now();
  std::vector<std::future<std::string>> outcomes;
  for (int id : {0, 1}) {
    outcomes.push_back(std::async(std::launch::async, [&, id] {
      try {
        ProcessGroup::create(set, id, store, options);
        return std::string("<made>");
      } catch (const Error& e) {
        return std::string(e.what());
      }
    }));
  }
  for (auto& outcome : outcomes) EXPECT_NE(outcome.get(), "<made>");
  EXPECT_LT(Clock::now() - start, 10s);
}

// check_peers(): what a trainer asks between layers, without a collective.
TEST_P(GroupRebuild, CheckPeersNamesAMemberThatExitedOrLeftWithoutACollective) {
  const std::string here = detail::pid_namespace_of(detail::process_identity());
  if (here.empty()) GTEST_SKIP() << "no /proc identity here";
  const auto store = make_memory_store();
  // Members 0 and 1 on node 0, member 2 on node 1: a group spanning nodes,
  // where departures are asked of the store.
  MemberSet set = set_of(7, {0, 1, 2});
  set.members[2].node = 1;
  auto groups = make_groups(set, store, options_for(GetParam()));
  // The members are threads of this process; member 1's key is made to name
  // a process that has exited (as if it were another process, now dead).
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);
  store->set("e7/proc/1", here + " " + std::to_string(child));
  const std::string exited = "a peer is gone: rank 1 (pid " + std::to_string(child) + ") exited";
  // Twice at once: the second call comes within the 10 ms between looks,
  // and must still throw (a caller that catches and asks again).
  for (int call = 0; call < 2; ++call) {
    try {
      groups[0]->check_peers();
      FAIL() << "member 0 must see that member 1, on its node, exited (call " << call << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank 0 (epoch 7): " + exited), std::string::npos)
          << e.what();
    }
  }
  EXPECT_NO_THROW(groups[1]->check_peers());  // its own key is not looked at
  EXPECT_NO_THROW(groups[2]->check_peers());  // another node's pids mean nothing there

  // Member 2 aborts: it knows at once, member 1 once it next asks the store
  // (at most a second after its last ask).
  groups[2]->abort();
  EXPECT_THROW(groups[2]->check_peers(), Error);
  const auto deadline = Clock::now() + 3s;
  std::string seen;
  while (seen.empty() && Clock::now() < deadline) {
    try {
      groups[1]->check_peers();
      std::this_thread::sleep_for(20ms);
    } catch (const Error& e) {
      seen = e.what();
    }
  }
  EXPECT_NE(seen.find("rank 1 (epoch 7): a peer is gone: rank 2 left the group"), std::string::npos)
      << seen;
}

INSTANTIATE_TEST_SUITE_P(Backends, GroupRebuild, ::testing::Values("shm", "gloo"),
                         [](const auto& info) { return info.param; });

TEST(GroupRebuild, PlacesEachMemberOnItsNodeAndRefusesBadSets) {
  auto store = make_memory_store();
  MemberSet set;
  set.epoch = 3;
  set.members = {{0, 0}, {1, 0}, {4, 2}, {5, 2}};
  EXPECT_EQ(set.rank_of(4), 2);
  EXPECT_EQ(set.rank_of(2), -1);
  EXPECT_EQ(set.describe(), "0 1 4 5");
  try {
    ProcessGroup::create(set, 7, store, options_for("gloo"));
    FAIL() << "a process that is not a member must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("member 7 is not in epoch 3"), std::string::npos)
        << e.what();
  }
  MemberSet split = set;
  split.members = {{0, 0}, {4, 2}, {1, 0}};
  try {
    ProcessGroup::create(split, 0, store, options_for("shm"));
    FAIL() << "a node whose members are not consecutive must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node 0 are not consecutive"), std::string::npos)
        << e.what();
  }
  MemberSet twice = set;
  twice.members = {{0, 0}, {0, 0}};
  EXPECT_THROW(ProcessGroup::create(twice, 0, store, options_for("gloo")), Error);
}

}  // namespace
}  // namespace ddp
