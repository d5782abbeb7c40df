// RendezvousState with --on_failure=heal (config.heal): a node whose
// heartbeats stop is lost, left out of the running round, which goes on while
// at least min_nodes remain; a node that joins later takes a lost node's
// place in the running round.

#include "rendezvous_state_fixture.h"

namespace ddp::launcher {
namespace rendezvous_test {
namespace {

RendezvousConfig heal_config(int min_nodes, int max_nodes) {
  RendezvousConfig c = make_config(min_nodes, max_nodes, 2);
  c.heal = true;
  return c;
}

TEST_F(RendezvousStateTest, UnderHealASilentNodeIsLostAndTheOthersGoOn) {
  RendezvousState s(heal_config(1, 3));
  std::vector<std::string> lost;
  s.on_node_lost([&](const std::string& what) { lost.push_back(what); });
  form(s, 3);
  advance(20s);
  ASSERT_NO_THROW(s.heartbeat(kAuth, 1, 0, now));
  ASSERT_NO_THROW(s.heartbeat(kAuth, 1, 1, now));
  advance(10s);  // node 2: 30 s silent since the round formed
  EXPECT_FALSE(s.heartbeat(kAuth, 1, 0, now).round_ended);
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kRunning);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0],
            "node 2 (host 'host2') stopped sending heartbeats for 30.0s: left out of round 1 "
            "(--on_failure=heal); 2 node(s) go on");
  // For the other nodes' workers, whose groups stop waiting on its ranks.
  EXPECT_EQ(s.store(kAuth).add(lost_nodes_key(1), 0), 1);
  EXPECT_EQ(s.store(kAuth).get(lost_node_key(1, 1)),
            "2 node 2 (host 'host2') stopped sending heartbeats for 30.0s");
  EXPECT_EQ(s.broken_invariant(), "");

  // The lost node, if it speaks again, hears that its round ended for it for
  // good; its failure report ends nothing for the others.
  const RoundStatus late = s.heartbeat(kAuth, 1, 2, now);
  EXPECT_TRUE(late.round_ended);
  EXPECT_FALSE(late.can_restart);
  EXPECT_THAT(late.reason, HasSubstr("node 2 (host 'host2') was left out of round 1"));
  EXPECT_FALSE(s.report_failure(kAuth, 1, 2, "late", 1, now));
  ASSERT_TRUE(s.round_end(1, 2, now).has_value());
  EXPECT_FALSE(s.round_end(1, 0, now).has_value());
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kRunning);

  // The others finish: the job succeeded, using no restart.
  s.leave(kAuth, 1, 0, 0, now);
  s.leave(kAuth, 1, 1, 0, now);
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kSucceeded);
  EXPECT_EQ(s.restarts_used(), 0);
  EXPECT_EQ(s.broken_invariant(), "");
}

TEST_F(RendezvousStateTest, UnderHealFewerThanMinNodesLeftEndsTheRound) {
  RendezvousState s(heal_config(2, 2));
  form(s, 2);
  advance(20s);
  ASSERT_NO_THROW(s.heartbeat(kAuth, 1, 0, now));
  advance(10s);
  const RoundStatus r = s.heartbeat(kAuth, 1, 0, now);
  EXPECT_TRUE(r.round_ended);
  EXPECT_EQ(r.reason,
            "node 1 (host 'host1') stopped sending heartbeats for 30.0s; 1 node(s) remain, "
            "fewer than the 2 the job needs (--nnodes=2)");
  EXPECT_TRUE(r.can_restart);  // a restart, as without heal
  EXPECT_EQ(s.restarts_used(), 1);
}

TEST_F(RendezvousStateTest, UnderHealTheLastNodeToFinishBeforeTheLossCompletesTheJob) {
  RendezvousState s(heal_config(1, 2));
  form(s, 2);
  s.leave(kAuth, 1, 0, 0, now);  // node 0 done; node 1 then goes silent
  advance(31s);
  EXPECT_TRUE(s.heartbeat(kAuth, 1, 0, now, true).round_ended);
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kSucceeded);
}

// Forms a round of 3 (node 2 with 2 workers), then node 1 goes silent and is lost.
// Returns the three nodes' places.
std::vector<RoundAssignment> lose_node_1(RendezvousState& s, TimePoint& now) {
  std::vector<JoinTicket> t;
  t.push_back(s.join(kAuth, node("host0"), now));
  t.push_back(s.join(kAuth, node("host1"), now));
  t.push_back(s.join(kAuth, node("host2", 2), now));
  std::vector<RoundAssignment> places;
  for (auto ticket : t) places.push_back(s.join_status(ticket, now).value());
  now += 20s;
  s.heartbeat(kAuth, 1, 0, now);
  s.heartbeat(kAuth, 1, 2, now);
  now += 10s;
  EXPECT_FALSE(s.heartbeat(kAuth, 1, 0, now).round_ended);
  return places;
}

TEST_F(RendezvousStateTest, UnderHealANodeJoiningLaterTakesTheLostPlaceInTheRunningRound) {
  RendezvousState s(heal_config(2, 3));
  std::vector<std::string> said;
  s.on_node_lost([&](const std::string& what) { said.push_back(what); });
  const std::uint64_t old = lose_node_1(s, now)[1].member;
  const std::uint64_t round_changes = s.version();

  // A new machine: it takes node 1's place, ranks and all, at once.
  const RoundAssignment a = joined(s, join(s, node("spare")));
  EXPECT_TRUE(a.joined_running);
  EXPECT_EQ(a.round, 1);
  EXPECT_EQ(a.group_rank, 1);
  EXPECT_EQ(a.group_world_size, 3);
  EXPECT_EQ(a.world_size, 4);
  EXPECT_EQ(a.global_rank_offset, 1);
  EXPECT_EQ(a.master_addr, "host0.addr");
  EXPECT_EQ(a.restart_count, 0);
  EXPECT_GT(a.member, old);
  EXPECT_GT(s.version(), round_changes);
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kRunning);
  EXPECT_EQ(s.restarts_used(), 0);
  ASSERT_EQ(said.size(), 2u);
  EXPECT_EQ(said[1],
            "host 'spare' takes the place of lost host 'host1' as node 1 in running round 1 "
            "(ranks 1-1; --on_failure=heal): its workers heal from the live ranks");
  // One relaunch spent from the job's budget (max_restarts 2).
  EXPECT_EQ(s.store(kAuth).add(kHealRelaunchesKey, 0), 1);
  // Node 1 was counted lost once, when it went silent: taking its place is no loss.
  EXPECT_EQ(s.store(kAuth).add(lost_nodes_key(1), 0), 1);
  EXPECT_EQ(s.broken_invariant(), "");

  // The newcomer heartbeats as node 1; the old agent, speaking again with
  // its own id, hears that another took its place, and changes nothing.
  EXPECT_FALSE(s.heartbeat(kAuth, 1, 1, now, false, a.member).round_ended);
  const RoundStatus stale = s.heartbeat(kAuth, 1, 1, now, false, old);
  EXPECT_TRUE(stale.round_ended);
  EXPECT_FALSE(stale.can_restart);
  EXPECT_THAT(stale.reason, HasSubstr("host 'spare' took its place as node 1"));
  EXPECT_FALSE(s.report_failure(kAuth, 1, 1, "stale", 1, now, old));
  s.leave(kAuth, 1, 1, 1, now, old);
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kRunning);
  ASSERT_TRUE(s.round_end(1, 1, now, old).has_value());
  EXPECT_FALSE(s.round_end(1, 1, now, a.member).has_value());
  // A larger id is the holder itself, joined to a later round since.
  EXPECT_FALSE(s.round_end(1, 1, now, a.member + 7).has_value());

  // Heartbeats keep it in; everyone finishing completes the job.
  now += 20s;
  for (int g = 0; g < 3; ++g) s.heartbeat(kAuth, 1, g, now);
  for (int g = 0; g < 3; ++g) s.leave(kAuth, 1, g, 0, now, g == 1 ? a.member : 0);
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kSucceeded);
  EXPECT_EQ(s.broken_invariant(), "");
}

TEST_F(RendezvousStateTest, UnderHealALostNodeComingBackTakesItsOwnPlace) {
  RendezvousState s(heal_config(1, 3));
  lose_node_1(s, now);
  // Node 1 is lost; host 2 is lost too; the relaunched host2 (2 workers)
  // takes its own place, not the lowest lost one.
  for (int i = 0; i < 2; ++i) {
    now += 15s;
    s.heartbeat(kAuth, 1, 0, now);
  }
  const RoundAssignment a = joined(s, join(s, node("host2", 2)));
  EXPECT_TRUE(a.joined_running);
  EXPECT_EQ(a.group_rank, 2);
  EXPECT_EQ(a.global_rank_offset, 2);
  // A node whose worker count fits no lost place is told, as before, that
  // the round is full (3 of at most 3 nodes).
  const Refusal big = refused([&] { join(s, node("big", 8)); });
  EXPECT_EQ(big.code, RpcCode::kUnavailable);
  EXPECT_THAT(big.message, HasSubstr("round 1 is full"));
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kRunning);
  EXPECT_EQ(s.broken_invariant(), "");
}

TEST_F(RendezvousStateTest, UnderHealARelaunchOfALiveNodeTakesItsPlaceAndItsOldAgentIsLost) {
  RendezvousState s(heal_config(2, 2));
  std::vector<std::string> said;
  s.on_node_lost([&](const std::string& what) { said.push_back(what); });
  form(s, 2);
  const RoundAssignment a = joined(s, join(s, node("host1")));  // its scheduler started it again
  EXPECT_TRUE(a.joined_running);
  EXPECT_EQ(a.group_rank, 1);
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kRunning);
  EXPECT_EQ(s.restarts_used(), 0);
  ASSERT_EQ(said.size(), 2u);
  EXPECT_EQ(said[0],
            "node 1 (host 'host1') was relaunched (a new agent joined): left out of round 1 "
            "(--on_failure=heal); 1 node(s) go on");
  EXPECT_EQ(s.store(kAuth).add(lost_nodes_key(1), 0), 1);  // the old agent's ranks are gone
  EXPECT_EQ(s.store(kAuth).get(lost_node_key(1, 1)),
            "1 node 1 (host 'host1') was relaunched (a new agent joined)");
  EXPECT_EQ(s.broken_invariant(), "");
}

TEST_F(RendezvousStateTest, UnderHealTakingAPlaceSpendsARestartAndWithNoneLeftTheJoinIsRefused) {
  RendezvousConfig c = heal_config(2, 3);
  c.max_restarts = 1;
  RendezvousState s(c);
  lose_node_1(s, now);
  s.store(kAuth).add(kHealRelaunchesKey, 1);  // an agent relaunched a rank already
  const Refusal r = refused([&] { join(s, node("spare")); });
  EXPECT_EQ(r.code, RpcCode::kFailedPrecondition);
  EXPECT_EQ(r.message,
            "host 'spare' cannot take the place of node 1 (host 'host1') in running round 1: no "
            "restarts left for it (--max_restarts=1, spent on relaunches)");
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kRunning);
  EXPECT_EQ(s.store(kAuth).add(kHealRelaunchesKey, 0), 1);
  EXPECT_EQ(s.broken_invariant(), "");
}

TEST_F(RendezvousStateTest, UnderHealANewNodeJoinsTheRunningRoundOnceItsProgramHeals) {
  RendezvousState s(heal_config(2, 5));
  std::vector<std::string> said;
  s.on_node_lost([&](const std::string& what) { said.push_back(what); });
  std::vector<JoinTicket> t = {join(s, node("host0", 2)), join(s, node("host1", 2))};
  advance(30s);  // the last call: a round of 2
  for (auto ticket : t) joined(s, ticket);
  // The program has not said it heals: the round restarts to take the
  // newcomer in (torchrun's scale-up, no restart spent).
  {
    RendezvousState plain(heal_config(2, 4));
    std::vector<JoinTicket> p = {plain.join(kAuth, node("host0", 2), now),
                                 plain.join(kAuth, node("host1", 2), now)};
    TimePoint later = now + 30s;
    for (auto ticket : p) ASSERT_TRUE(plain.join_status(ticket, later).has_value());
    plain.join(kAuth, node("host2", 2), later);
    EXPECT_EQ(plain.phase(), RendezvousState::Phase::kForming);
  }

  s.store(kAuth).set(healing_round_key(1), "1");  // libddp's first group formed
  const RoundAssignment a = joined(s, join(s, node("host2", 3)));
  EXPECT_TRUE(a.joined_running);
  EXPECT_EQ(a.round, 1);
  EXPECT_EQ(a.group_rank, 2);
  EXPECT_EQ(a.group_world_size, 3);
  EXPECT_EQ(a.world_size, 7);
  EXPECT_EQ(a.global_rank_offset, 4);
  EXPECT_EQ(a.master_addr, "host0.addr");
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kRunning);
  EXPECT_EQ(s.restarts_used(), 0);
  EXPECT_EQ(s.store(kAuth).add(kHealRelaunchesKey, 0), 0) << "a scale-up spends no restart";
  ASSERT_EQ(said.size(), 1u);
  EXPECT_EQ(said[0],
            "host 'host2' joins running round 1 as node 2 (ranks 4-6; world 4 -> 7; "
            "--on_failure=heal): the live ranks admit its workers");
  EXPECT_FALSE(s.heartbeat(kAuth, 1, 2, now, false, a.member).round_ended);
  EXPECT_EQ(s.broken_invariant(), "");

  // An explicit node rank that is not the next one (3) cannot join this
  // way: the round restarts to take it in, as without heal.
  join(s, node("host9", 1, 4));
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kForming);
  EXPECT_EQ(s.broken_invariant(), "");
}

}  // namespace
}  // namespace rendezvous_test
}  // namespace ddp::launcher
