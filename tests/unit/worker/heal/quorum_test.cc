// The rule by which a group's members agree on the next epoch (pure logic,
// injected clock and liveness).

#include "heal/quorum.h"

#include <gtest/gtest.h>

#include <set>

#include "ddp/common/error.h"

namespace ddp::detail {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

Arrival arrival(int id, int node, std::string proc, std::int64_t committed = 7) {
  return {id, node, std::move(proc), committed};
}

TEST(Quorum, ArrivalsRoundTripAndAMalformedOneNamesItsKey) {
  const Arrival a = arrival(3, 1, "boot/pid:[4026531836] 1234", -1);
  EXPECT_EQ(decode_arrival(encode(a), "k"), a);
  const std::vector<Arrival> all = {a, arrival(0, 0, "x 1")};
  EXPECT_EQ(decode_arrivals(encode(all), "k"), all);
  try {
    decode_arrival("three 1 2 p", "key e1/arrived/3");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("key e1/arrived/3"), std::string::npos) << e.what();
  }
}

TEST(Quorum, ReadyOnceEveryPreviousMemberArrivedOrIsKnownDead) {
  const std::vector<Arrival> previous = {arrival(0, 0, "p0"), arrival(1, 0, "p1"),
                                         arrival(2, 0, "p2")};
  std::set<std::string> dead;
  const DeathOracle is_dead = [&](const std::string& p) { return dead.count(p) > 0; };
  const auto now = Clock::time_point{} + 100s;
  const auto deadline = now + 5s;
  std::map<int, Arrival> arrived = {{0, arrival(0, 0, "p0")}, {1, arrival(1, 0, "p1")}};
  EXPECT_FALSE(quorum_ready(previous, arrived, is_dead, now, deadline))
      << "member 2 may still arrive";
  dead.insert("p2");
  EXPECT_TRUE(quorum_ready(previous, arrived, is_dead, now, deadline))
      << "member 2's process is gone: no need to wait for it";
  dead.clear();
  EXPECT_TRUE(quorum_ready(previous, arrived, is_dead, deadline, deadline))
      << "at the deadline the arrivals go on without member 2";
  // A relaunched process arrives under the id of the one it replaces.
  arrived[2] = arrival(2, 0, "p2-relaunched");
  EXPECT_TRUE(quorum_ready(previous, arrived, is_dead, now, deadline));
}

TEST(Quorum, AReadyEpochIsHeldOpenForADeadMembersRelaunchUntilItsTime) {
  const std::vector<Arrival> previous = {arrival(0, 0, "p0"), arrival(1, 0, "p1"),
                                         arrival(2, 0, "p2")};
  std::set<std::string> dead;
  const DeathOracle is_dead = [&](const std::string& p) { return dead.count(p) > 0; };
  const auto now = Clock::time_point{} + 100s;
  const auto until = now + 800ms;
  std::map<int, Arrival> arrived = {{0, arrival(0, 0, "p0")}, {1, arrival(1, 0, "p1")}};
  EXPECT_FALSE(awaits_relaunch(previous, arrived, is_dead, now, until))
      << "member 2 is not known dead: the quorum's own rule waits for it";
  dead.insert("p2");
  EXPECT_TRUE(awaits_relaunch(previous, arrived, is_dead, now, until))
      << "member 2 died and nothing arrived in its place yet";
  EXPECT_FALSE(awaits_relaunch(previous, arrived, is_dead, until, until))
      << "its time is up: the epoch goes on without it";
  arrived[2] = arrival(2, 0, "p2");  // it arrived, then died
  EXPECT_TRUE(awaits_relaunch(previous, arrived, is_dead, now, until));
  arrived[2] = arrival(2, 0, "p2-relaunched");
  EXPECT_FALSE(awaits_relaunch(previous, arrived, is_dead, now, until))
      << "the relaunch arrived under its predecessor's id";
  dead.insert("p2-relaunched");
  EXPECT_TRUE(awaits_relaunch(previous, arrived, is_dead, now, until))
      << "the relaunch died too: another may follow";
  EXPECT_FALSE(awaits_relaunch(previous, arrived, is_dead, now, now)) << "no time to wait";
}

TEST(Quorum, MembersAreTheLiveArrivalsByNodeThenId) {
  std::map<int, Arrival> arrived = {{5, arrival(5, 0, "a")},
                                    {1, arrival(1, 1, "b")},
                                    {0, arrival(0, 1, "c")},
                                    {3, arrival(3, 0, "dead")}};
  const auto members = quorum_members(arrived, [](const std::string& p) { return p == "dead"; });
  ASSERT_EQ(members.size(), 3u);
  EXPECT_EQ(members[0].id, 5);
  EXPECT_EQ(members[1].id, 0);
  EXPECT_EQ(members[2].id, 1);
  const MemberSet set = member_set(4, members);
  EXPECT_EQ(set.epoch, 4u);
  EXPECT_EQ(set.rank_of(1), 2);
  EXPECT_EQ(set.members[0].node, 0);
}

TEST(Quorum, TheLocalOracleKnowsThisMachinesDeadAndNeverGuessesElsewhere) {
  const DeathOracle is_dead = local_death_oracle();
  EXPECT_FALSE(is_dead("")) << "unknown process: cannot tell";
  EXPECT_FALSE(is_dead("otherboot/pid:[1] 1")) << "another machine: cannot tell";
}

TEST(Quorum, AnEpochChangeNamesWhoLeftArrivedAndWasReplaced) {
  const std::vector<Arrival> before = {arrival(0, 0, "a"), arrival(1, 0, "b"), arrival(2, 0, "c")};
  const std::vector<Arrival> after = {arrival(0, 0, "a"), arrival(2, 0, "c2"), arrival(5, 1, "e")};
  const EpochChange change = epoch_change(before, after);
  EXPECT_EQ(change.left, std::vector<int>{1});
  EXPECT_EQ(change.arrived, std::vector<int>{5});
  EXPECT_EQ(change.replaced, std::vector<int>{2});
}

TEST(Quorum, ArrivalsAreAskedForAboutEveryIntervalRampingUpAndAtMostEvery65thBoundary) {
  // 4 ms steps: 12 boundaries per 50 ms, so 11 skipped and the 12th asks,
  // once the count has ramped up (0, 1, 3, 7, then 11).
  EXPECT_EQ(boundaries_to_skip(4ms, 1, 50ms, 0), 1);
  EXPECT_EQ(boundaries_to_skip(8ms, 2, 50ms, 1), 3);
  EXPECT_EQ(boundaries_to_skip(16ms, 4, 50ms, 3), 7);
  EXPECT_EQ(boundaries_to_skip(32ms, 8, 50ms, 7), 11);
  EXPECT_EQ(boundaries_to_skip(48ms, 12, 50ms, 11), 11);
  // Steps of the interval or longer: every boundary asks, at once when
  // steps grow (an evaluation).
  EXPECT_EQ(boundaries_to_skip(50ms, 1, 50ms, 0), 0);
  EXPECT_EQ(boundaries_to_skip(2s, 12, 50ms, 11), 0);
  // Very short steps: at most kMaxSkippedBoundaries.
  EXPECT_EQ(boundaries_to_skip(10us, 1, 50ms, 63), kMaxSkippedBoundaries);
  EXPECT_EQ(boundaries_to_skip(10us, 1, 50ms, kMaxSkippedBoundaries), kMaxSkippedBoundaries);
  EXPECT_EQ(kMaxSkippedBoundaries, 64);
  // Nothing measured: the ramp's next value, never a division by zero.
  EXPECT_EQ(boundaries_to_skip(0ns, 1, 50ms, 0), 1);
  EXPECT_EQ(boundaries_to_skip(5ms, 0, 50ms, 3), 7);
}

}  // namespace
}  // namespace ddp::detail
