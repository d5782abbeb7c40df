// NodeLiveness on its own: heartbeats move the running round's deadline, a
// silent node ends the round or (heal) is lost, and a replaced node's word
// changes nothing.

#include "rendezvous/node_liveness.h"

#include "rendezvous_state_fixture.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ddp::launcher {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

const TimePoint t0 = TimePoint{} + 1000h;

// Two nodes in a formed round 1 (heartbeat_timeout 30 s).
struct Parts {
  explicit Parts(bool heal) {
    config = rendezvous_test::make_config(1, 2, 1);
    config.heal = heal;
    for (const char* host : {"a", "b"}) rounds.join(NodeInfo{-1, 1, host, "", 29500}, t0, {});
  }
  RendezvousConfig config;
  KeyValueStore store{config.limits};
  RoundFormation rounds{config};
  NodeLiveness liveness{config, rounds, store};
};

TEST(NodeLiveness, HeartbeatsMoveTheDeadlineAndSilenceEndsTheRound) {
  Parts p(false);
  EXPECT_EQ(p.liveness.next_deadline(), t0 + 30s);
  p.liveness.heartbeat(p.rounds.find_member(1, 0), 1, 0, t0 + 20s, false, 0);
  EXPECT_EQ(p.liveness.next_deadline(), t0 + 30s) << "node 1 is still silent since the start";
  p.liveness.expire(t0 + 30s);
  const Round& r = p.rounds.find_member(1, 0);
  EXPECT_TRUE(r.ended);
  EXPECT_EQ(r.reason, "node 1 (host 'b') stopped sending heartbeats for 30.0s");
  EXPECT_EQ(p.liveness.next_deadline(), std::nullopt);
  const RoundStatus heard = p.liveness.heartbeat(p.rounds.find_member(1, 0), 1, 0, t0, true, 0);
  EXPECT_TRUE(heard.round_ended);
  EXPECT_TRUE(heard.can_restart);
}

// The deadline is remembered between requests, never stale: each node's
// heartbeat in turn moves it, and a node due later that falls silent is
// still found once the one due first has heartbeated past it.
TEST(NodeLiveness, TheRememberedDeadlineFollowsEveryHeartbeatAndDeparture) {
  Parts p(false);
  p.liveness.expire(t0 + 10s);  // nothing due: remembers t0 + 30 s
  EXPECT_EQ(p.liveness.next_deadline(), t0 + 30s);
  p.liveness.heartbeat(p.rounds.find_member(1, 0), 1, 0, t0 + 10s, false, 0);
  EXPECT_EQ(p.liveness.next_deadline(), t0 + 30s) << "node 1 is due at the same time";
  p.liveness.heartbeat(p.rounds.find_member(1, 0), 1, 1, t0 + 15s, false, 0);
  EXPECT_EQ(p.liveness.next_deadline(), t0 + 40s) << "node 0 is due first now";
  p.liveness.expire(t0 + 35s);
  EXPECT_FALSE(p.rounds.find_member(1, 0).ended) << "nobody is silent at t0 + 35 s";
  p.liveness.heartbeat(p.rounds.find_member(1, 0), 1, 0, t0 + 39s, false, 0);
  EXPECT_EQ(p.liveness.next_deadline(), t0 + 45s) << "node 1 is due first now";
  p.liveness.expire(t0 + 45s);
  EXPECT_EQ(p.rounds.find_member(1, 0).reason,
            "node 1 (host 'b') stopped sending heartbeats for 30.0s");
}

TEST(NodeLiveness, ADepartureMovesTheRememberedDeadline) {
  Parts p(false);
  p.liveness.heartbeat(p.rounds.find_member(1, 0), 1, 1, t0 + 10s, false, 0);
  EXPECT_EQ(p.liveness.next_deadline(), t0 + 30s);
  p.liveness.leave(p.rounds.find_member(1, 0), 0, 0, 0);
  EXPECT_EQ(p.liveness.next_deadline(), t0 + 40s) << "only node 1 is left to watch";
}

TEST(NodeLiveness, UnderHealASilentNodeIsLostAndTheRoundGoesOn) {
  Parts p(true);
  std::vector<std::string> lost;
  p.liveness.on_node_lost([&](const std::string& what) { lost.push_back(what); });
  p.liveness.heartbeat(p.rounds.find_member(1, 0), 1, 0, t0 + 20s, false, 0);
  const std::uint64_t before = p.liveness.changes();
  p.liveness.expire(t0 + 30s);
  EXPECT_GT(p.liveness.changes(), before);
  Round& r = p.rounds.find_member(1, 0);
  EXPECT_FALSE(r.ended);
  EXPECT_TRUE(r.members[1].lost);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_THAT(lost[0], HasSubstr("left out of round 1 (--on_failure=heal); 1 node(s) go on"));
  EXPECT_EQ(p.store.get(lost_node_key(1, 1)),
            "1 node 1 (host 'b') stopped sending heartbeats for 30.0s");
  EXPECT_FALSE(p.liveness.report_failure(r, 1, "late", 1, 0)) << "a lost node ends nothing";
  EXPECT_FALSE(r.ended);
  std::optional<RoundStatus> told = p.liveness.round_end(r, 1, 1, 0);
  ASSERT_TRUE(told.has_value());
  EXPECT_THAT(told->reason, HasSubstr("was left out of round 1 after its heartbeats stopped"));
}

TEST(NodeLiveness, AJoinerTakesALostPlaceAndTheReplacedNodeIsToldSo) {
  Parts p(true);
  p.liveness.heartbeat(p.rounds.find_member(1, 0), 1, 0, t0 + 20s, false, 0);
  p.liveness.expire(t0 + 30s);
  Round& r = p.rounds.find_member(1, 0);
  const std::uint64_t old_member = r.members[1].ticket;
  std::optional<JoinTicket> took = p.liveness.admit(r, NodeInfo{-1, 1, "c", "", 29500}, t0 + 31s);
  ASSERT_TRUE(took.has_value());
  EXPECT_EQ(r.members[1].args.hostname, "c");
  EXPECT_EQ(p.store.add(kHealRelaunchesKey, 0), 1) << "one relaunch spent";
  const RoundStatus old = p.liveness.heartbeat(r, 1, 1, t0 + 31s, false, old_member);
  EXPECT_TRUE(old.round_ended);
  EXPECT_THAT(old.reason, HasSubstr("host 'c' took its place as node 1"));
  EXPECT_FALSE(p.liveness.heartbeat(r, 1, 1, t0 + 31s, false, took->id).round_ended);
  EXPECT_TRUE(p.rounds.join_status(*took)->joined_running);
}

TEST(NodeLiveness, EveryNodeLeavingWithZeroSucceeds) {
  Parts p(false);
  Round& r = p.rounds.find_member(1, 0);
  p.liveness.leave(r, 0, 0, 0);
  p.liveness.leave(r, 0, 0, 0);  // twice: a no-op
  EXPECT_FALSE(r.ended);
  p.liveness.leave(r, 1, 0, 0);
  EXPECT_TRUE(r.ended && r.succeeded);
  EXPECT_EQ(p.rounds.phase(), RendezvousPhase::kSucceeded);
}

}  // namespace
}  // namespace ddp::launcher
