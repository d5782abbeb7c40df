// RendezvousState with --on_failure=heal (config.heal): a node whose
// heartbeats stop is lost, left out of the running round, which goes on while
// at least min_nodes remain.

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

}  // namespace
}  // namespace rendezvous_test
}  // namespace ddp::launcher
