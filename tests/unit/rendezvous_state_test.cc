// RendezvousState driven by hand: a fake clock advanced in each test, tickets
// polled like the gRPC service would.
// Over 600 lines because it is the state machine's whole specification by
// example (rounds, elasticity, store, barriers, limits), on one fake clock.

#include "rendezvous_state_fixture.h"

namespace ddp::launcher {
namespace rendezvous_test {
namespace {

// --- Joining and rank assignment ------------------------------------------

TEST_F(RendezvousStateTest, JoinAssignsAutoRanksByHostnameThenAddressThenArrival) {
  RendezvousState s(make_config(4, 4));
  NodeInfo later_b = node("b", 2);
  later_b.address = "10.0.0.1";
  NodeInfo earlier_b = node("b", 3);
  earlier_b.address = "10.0.0.2";
  auto tc = join(s, node("c", 4));
  auto tb2 = join(s, earlier_b);
  auto tb1 = join(s, later_b);
  EXPECT_FALSE(s.join_status(tc, now).has_value()) << "round must wait for the 4th node";
  auto ta = join(s, node("a", 1));

  RoundAssignment a = joined(s, ta), b1 = joined(s, tb1), b2 = joined(s, tb2), c = joined(s, tc);
  EXPECT_EQ(a.group_rank, 0);
  EXPECT_EQ(b1.group_rank, 1);  // same hostname: the smaller address first
  EXPECT_EQ(b2.group_rank, 2);
  EXPECT_EQ(c.group_rank, 3);
  EXPECT_EQ(a.global_rank_offset, 0);
  EXPECT_EQ(b1.global_rank_offset, 1);
  EXPECT_EQ(b2.global_rank_offset, 3);
  EXPECT_EQ(c.global_rank_offset, 6);
  for (const auto& r : {a, b1, b2, c}) {
    EXPECT_EQ(r.world_size, 10);
    EXPECT_EQ(r.group_world_size, 4);
    EXPECT_EQ(r.round, 1);
    EXPECT_EQ(r.restart_count, 0);
  }
}

TEST_F(RendezvousStateTest, JoinBreaksIdenticalHostTiesByArrival) {
  RendezvousState s(make_config(2, 2));
  auto first = join(s, node("same", 1));
  auto second = join(s, node("same", 2));
  EXPECT_EQ(joined(s, first).group_rank, 0);
  EXPECT_EQ(joined(s, second).group_rank, 1);
}

TEST_F(RendezvousStateTest, JoinHonoursExplicitNodeRanksAndFillsTheRest) {
  RendezvousState s(make_config(3, 3));
  auto z = join(s, node("z", 1, 0));
  auto b = join(s, node("b", 1, 2));
  auto a = join(s, node("a", 1));
  EXPECT_EQ(joined(s, z).group_rank, 0);
  EXPECT_EQ(joined(s, b).group_rank, 2);
  EXPECT_EQ(joined(s, a).group_rank, 1);
}

TEST_F(RendezvousStateTest, MasterAddressAndPortComeFromGroupRankZero) {
  RendezvousState s(make_config(2, 2));
  NodeInfo zero = node("later-but-rank0", 1, 0);
  zero.address = "10.1.1.1";
  zero.master_port = 31000;
  auto other = join(s, node("aaa", 1));
  join(s, zero);
  RoundAssignment r = joined(s, other);
  EXPECT_EQ(r.group_rank, 1);
  EXPECT_EQ(r.master_addr, "10.1.1.1");
  EXPECT_EQ(r.master_port, 31000);
}

TEST_F(RendezvousStateTest, DuplicateNodeRankFailsTheFormingRoundForEveryJoiner) {
  RendezvousState s(make_config(3, 3));
  auto first = join(s, node("first", 1, 1));
  auto r = refused([&] { s.join(kAuth, node("second", 1, 1), now); });
  EXPECT_EQ(r.code, RpcCode::kInvalidArgument);
  EXPECT_THAT(r.message,
              HasSubstr("node rank 1 was given to two nodes: host 'first' and host 'second'"));
  // The node already waiting hears it at once instead of at its join timeout.
  auto a = join_refusal(s, first);
  EXPECT_EQ(a.code, RpcCode::kInvalidArgument);
  EXPECT_EQ(a.message, r.message);
  EXPECT_FALSE(s.next_deadline().has_value());
  // A node of the job that comes later is told too, instead of waiting.
  auto late = refused([&] { s.join(kAuth, node("third", 1, 0), now); });
  EXPECT_EQ(late.message, r.message);
}

TEST_F(RendezvousStateTest, JoinRejectsBadNodeRankAndLocalWorldSize) {
  RendezvousState s(make_config(2, 2));
  auto rank = refused([&] { s.join(kAuth, node("h", 1, 2), now); });
  EXPECT_EQ(rank.code, RpcCode::kInvalidArgument);
  EXPECT_THAT(rank.message, HasSubstr("node rank 2"));
  EXPECT_THAT(rank.message, HasSubstr("--nnodes=2"));
  auto lws = refused([&] { s.join(kAuth, node("h", 0), now); });
  EXPECT_EQ(lws.code, RpcCode::kInvalidArgument);
  EXPECT_THAT(lws.message, HasSubstr("local world size 0"));
  EXPECT_EQ(s.version(), 0u);
}

TEST_F(RendezvousStateTest, JoinRejectsWrongToken) {
  RendezvousState s(make_config(2, 2));
  auto waiting = join(s, node("a"));
  const auto version = s.version();
  auto r = refused([&] { s.join(Auth{"run1", "guess"}, node("h"), now); });
  EXPECT_EQ(r.code, RpcCode::kUnauthenticated);
  EXPECT_EQ(r.message, "wrong rendezvous token");
  auto missing = refused([&] { s.join(Auth{"run1", ""}, node("h"), now); });
  EXPECT_THAT(missing.message, HasSubstr("missing rendezvous token"));
  // A request without the token may be anyone's: it changes nothing.
  EXPECT_EQ(s.version(), version);
  EXPECT_FALSE(s.join_status(waiting, now).has_value());
}

TEST_F(RendezvousStateTest, JoinRejectsMismatchedRunId) {
  RendezvousState s(make_config(2, 2));
  auto r = refused([&] { s.join(Auth{"other", "secret"}, node("h"), now); });
  EXPECT_EQ(r.code, RpcCode::kInvalidArgument);
  EXPECT_EQ(r.message, "run id 'other' does not match this server's run 'run1'");
  // The job's nodes disagree: one that joins later is told at once.
  auto later = refused([&] { s.join(kAuth, node("h2"), now); });
  EXPECT_EQ(later.code, RpcCode::kInvalidArgument);
  EXPECT_THAT(later.message, HasSubstr("host 'h' was refused: run id 'other'"));
}

TEST_F(RendezvousStateTest, MismatchedRunIdFailsTheFormingRoundAtOnce) {
  RendezvousState s(make_config(2, 2));
  auto waiting = join(s, node("a"));
  auto r = refused([&] { s.join(Auth{"other", "secret"}, node("b"), now); });
  EXPECT_EQ(r.code, RpcCode::kInvalidArgument);
  auto a = join_refusal(s, waiting);
  EXPECT_EQ(a.code, RpcCode::kInvalidArgument);
  EXPECT_THAT(a.message, HasSubstr("host 'b' was refused: run id 'other' does not match"));
}

TEST_F(RendezvousStateTest, UnauthenticatedServerTakesTokenlessRequestsAndRefusesATokenAtOnce) {
  RendezvousConfig c = make_config(2, 2);
  c.token = "";
  RendezvousState s(c);
  JoinTicket waiting = s.join(Auth{"run1", ""}, node("a"), now);
  ASSERT_NO_THROW(s.set(Auth{"run1", ""}, "k", "v"));
  auto r = refused([&] { s.join(Auth{"run1", "secret"}, node("b"), now); });
  EXPECT_EQ(r.code, RpcCode::kUnauthenticated);
  EXPECT_THAT(r.message, HasSubstr("runs without one"));
  // The nodes disagree: the waiting one is told now.
  auto a = join_refusal(s, waiting);
  EXPECT_EQ(a.code, RpcCode::kUnauthenticated);
  EXPECT_THAT(a.message, HasSubstr("host 'b' was refused"));
}

TEST_F(RendezvousStateTest, FullRoundAsksANewNodeToWait) {
  RendezvousState s(make_config(2, 2));
  form(s, 2);
  const auto version = s.version();
  auto r = refused([&] { s.join(kAuth, node("third"), now); });
  EXPECT_EQ(r.code, RpcCode::kUnavailable);
  EXPECT_THAT(r.message, HasSubstr("round 1 is full (2 nodes, --nnodes=2)"));
  EXPECT_EQ(r.reason, kReasonRoundFull) << "agents recognise it by its reason, not its text";
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kRunning);
  EXPECT_EQ(s.version(), version);
}

TEST_F(RendezvousStateTest, RelaunchedNodeEndsTheRoundUsingOneRestartAndJoinsTheNext) {
  RendezvousState s(make_config(2, 2, 1));
  auto t0 = join(s, node("a", 1, 0));
  auto t1 = join(s, node("b", 1, 1));
  joined(s, t0);
  joined(s, t1);
  advance(16s);  // b's agent died: no heartbeat for half the heartbeat timeout
  NodeInfo again = node("b-new-pod", 1, 1);  // the same node rank from a new agent
  auto t1b = join(s, again);
  EXPECT_EQ(s.restarts_used(), 1);
  auto hb = s.heartbeat(kAuth, 1, 0, now);
  EXPECT_TRUE(hb.round_ended);
  EXPECT_TRUE(hb.can_restart);
  EXPECT_THAT(hb.reason, HasSubstr("node 1 (host 'b') was relaunched"));
  auto t0b = join(s, node("a", 1, 0));
  RoundAssignment r = joined(s, t0b);
  EXPECT_EQ(r.round, 2);
  EXPECT_EQ(r.restart_count, 1);
  EXPECT_THAT(r.reason, HasSubstr("was relaunched"));
  EXPECT_EQ(joined(s, t1b).group_rank, 1);
  // No restart left: a second relaunch ends the job, and the newcomer hears why.
  advance(16s);
  auto late = refused([&] { s.join(kAuth, node("b-third-pod", 1, 1), now); });
  EXPECT_EQ(late.code, RpcCode::kFailedPrecondition);
  EXPECT_THAT(late.message, HasSubstr("no restarts left"));
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kFailed);
}

// Two live agents on different hosts given one --node_rank: the round goes
// on, and the newcomer hears at once who holds the rank and waits for it.
TEST_F(RendezvousStateTest, ANodeRankHeldByALiveNodeOfAnotherHostMakesTheNewcomerWait) {
  RendezvousState s(make_config(2, 2, 3));
  auto t0 = join(s, node("a", 1, 0));
  auto t1 = join(s, node("b", 1, 1));
  joined(s, t0);
  joined(s, t1);
  advance(5s);
  s.heartbeat(kAuth, 1, 1, now);  // b is alive
  advance(1s);
  auto r = refused([&] { s.join(kAuth, node("c", 1, 1), now); });
  EXPECT_EQ(r.code, RpcCode::kUnavailable);
  EXPECT_THAT(r.message,
              HasSubstr("node rank 1 is held by host 'b', which is alive (heard from 1.0s ago)"));
  EXPECT_THAT(r.message, HasSubstr("host 'c' waits for it; give each node its own --node_rank"));
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kRunning);
  EXPECT_EQ(s.restarts_used(), 0);
  // Once b has been silent for half the heartbeat timeout, c takes its place (a relaunch).
  advance(15s);
  join(s, node("c", 1, 1));
  EXPECT_EQ(s.restarts_used(), 1);
}

TEST_F(RendezvousStateTest, RelaunchOfAnAssignedRankIsKnownByHostAndAddress) {
  RendezvousState s(make_config(2, 2, 1));
  form(s, 2);
  join(s, node("host1"));  // same hostname and address as a member
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kForming);
  EXPECT_EQ(s.restarts_used(), 1);
}

TEST_F(RendezvousStateTest, ElasticRoundWithRoomScalesUpWithoutUsingARestart) {
  RendezvousState s(make_config(1, 3));  // no restarts at all
  auto t = join(s, node("a"));
  advance(30s);
  joined(s, t);
  auto late = join(s, node("late"));
  EXPECT_EQ(s.restarts_used(), 0);
  auto hb = s.heartbeat(kAuth, 1, 0, now);
  EXPECT_TRUE(hb.round_ended);
  EXPECT_TRUE(hb.can_restart);
  EXPECT_THAT(hb.reason,
              HasSubstr("scale-up: host 'late' arrived while round 1 ran with 1 of at most 3"));
  auto a = join(s, node("a"));
  advance(30s);  // last call: a third node may still come
  RoundAssignment r = joined(s, a);
  EXPECT_EQ(r.round, 2);
  EXPECT_EQ(r.group_world_size, 2);
  EXPECT_EQ(r.restart_count, 0);
  EXPECT_THAT(r.reason, HasSubstr("scale-up"));
  EXPECT_EQ(joined(s, late).round, 2);
}

TEST_F(RendezvousStateTest, OutcomeIsDeliveredOnceEveryNodeAcknowledgedIt) {
  RendezvousState s(make_config(2, 2));
  form(s, 2);
  EXPECT_FALSE(s.outcome_delivered());
  EXPECT_FALSE(s.round_end(1, 0, now).has_value());  // runs: a held heartbeat keeps waiting
  ASSERT_NO_THROW(s.leave(kAuth, 1, 0, 0, now));
  ASSERT_NO_THROW(s.leave(kAuth, 1, 1, 0, now));
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kSucceeded);
  EXPECT_FALSE(s.outcome_delivered()) << "nobody has heard of the success yet";
  auto end = s.round_end(1, 0, now);
  ASSERT_TRUE(end.has_value());
  EXPECT_TRUE(end->round_ended);
  EXPECT_TRUE(end->succeeded);
  EXPECT_TRUE(end->reason.empty());
  EXPECT_TRUE(s.heartbeat(kAuth, 1, 1, now).round_ended);
  EXPECT_FALSE(s.outcome_delivered())
      << "answers alone may be lost (a node tearing down its monitor)";
  ASSERT_NO_THROW(s.heartbeat(kAuth, 1, 0, now, /*heard_end=*/true));
  EXPECT_FALSE(s.outcome_delivered()) << "node 1 has not acknowledged";
  ASSERT_NO_THROW(s.heartbeat(kAuth, 1, 1, now, /*heard_end=*/true));
  EXPECT_TRUE(s.outcome_delivered());
}

TEST_F(RendezvousStateTest, ANodeWaitingForAPlaceMustHearTheOutcomeToo) {
  RendezvousState s(make_config(2, 2));
  form(s, 2);
  EXPECT_EQ(refused([&] { s.join(kAuth, node("late"), now); }).code, RpcCode::kUnavailable);
  ASSERT_NO_THROW(s.leave(kAuth, 1, 0, 0, now));
  ASSERT_NO_THROW(s.leave(kAuth, 1, 1, 0, now));
  s.heartbeat(kAuth, 1, 0, now, true);
  s.heartbeat(kAuth, 1, 1, now, true);
  EXPECT_FALSE(s.outcome_delivered()) << "the late node has not asked again";
  auto again = refused([&] { s.join(kAuth, node("late"), now); });
  EXPECT_EQ(again.code, RpcCode::kFailedPrecondition);
  EXPECT_THAT(again.message, HasSubstr("has already completed"));
  EXPECT_TRUE(s.outcome_delivered());
}

TEST_F(RendezvousStateTest, AFailuresReporterAndASilentNodeNeedNoTelling) {
  RendezvousState s(make_config(3, 3));
  form(s, 3);
  ASSERT_NO_THROW(s.heartbeat(kAuth, 1, 0, now));
  ASSERT_NO_THROW(s.heartbeat(kAuth, 1, 1, now));
  advance(s.config().heartbeat_timeout - 1ms);
  ASSERT_NO_THROW(s.heartbeat(kAuth, 1, 0, now));
  ASSERT_NO_THROW(s.heartbeat(kAuth, 1, 1, now));
  advance(2ms);
  s.tick(now);  // node 2 fell silent: it ends the round and is gone
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kFailed);
  EXPECT_FALSE(s.outcome_delivered());
  ASSERT_NO_THROW(s.heartbeat(kAuth, 1, 0, now, true));
  EXPECT_FALSE(s.outcome_delivered());
  ASSERT_NO_THROW(s.heartbeat(kAuth, 1, 1, now, true));
  EXPECT_TRUE(s.outcome_delivered());

  RendezvousState t(make_config(2, 2));
  form(t, 2);
  ASSERT_NO_THROW(t.report_failure(kAuth, 1, 1, "rank 3 died", 1, now));
  EXPECT_FALSE(t.outcome_delivered());
  EXPECT_THAT(t.round_end(1, 0, now)->reason, HasSubstr("rank 3 died"));
  ASSERT_NO_THROW(t.heartbeat(kAuth, 1, 0, now, true));
  EXPECT_TRUE(t.outcome_delivered()) << "the reporter knows";
}

TEST_F(RendezvousStateTest, TheStoresBytesAreBoundedWhateverTheMix) {
  RendezvousConfig c = make_config(1, 1);
  c.limits.max_store_bytes = 100;
  RendezvousState s(c);
  ASSERT_NO_THROW(s.set(kAuth, "a", std::string(59, 'x')));  // 60 bytes with its key
  auto full = refused([&] { s.set(kAuth, "b", std::string(59, 'y')); });
  EXPECT_EQ(full.code, RpcCode::kResourceExhausted);
  EXPECT_THAT(full.message,
              HasSubstr("the store would hold 120 bytes, limit 100 (--rdzv_conf max_store_bytes)"));
  EXPECT_EQ(refused([&] { s.compare_set(kAuth, "b", "", std::string(59, 'y')); }).code,
            RpcCode::kResourceExhausted);
  ASSERT_NO_THROW(s.set(kAuth, "a", std::string(90, 'z')))
      << "a replaced value frees its old bytes";
  EXPECT_EQ(refused([&] { s.add(kAuth, "counter", 1); }).code, RpcCode::kResourceExhausted);
  ASSERT_TRUE(s.remove(kAuth, "a"));
  ASSERT_NO_THROW(s.set(kAuth, "b", std::string(59, 'y'))) << "a removed key frees its bytes";
  EXPECT_EQ(s.add(kAuth, "counter", 5), 5);
  EXPECT_EQ(s.broken_invariant(), "");
}

TEST_F(RendezvousStateTest, FirstRoundHasNoReason) {
  RendezvousState s(make_config(1, 1));
  auto t = join(s, node("a"));
  EXPECT_EQ(joined(s, t).reason, "");
}

TEST_F(RendezvousStateTest, JoinRejectsWorldSizeOverTheLimit) {
  RendezvousConfig c = make_config(2, 2);
  c.limits.max_world_size = 8;
  RendezvousState s(c);
  join(s, node("a", 5));
  auto r = refused([&] { s.join(kAuth, node("b", 4), now); });
  EXPECT_EQ(r.code, RpcCode::kResourceExhausted);
  EXPECT_THAT(r.message, HasSubstr("the world size would be 9, limit 8"));
  auto fits = join(s, node("b", 3));
  EXPECT_EQ(joined(s, fits).world_size, 8);
}

// --- Closing a round ---------------------------------------------------------

TEST_F(RendezvousStateTest, ElasticRoundClosesAfterLastCallWindowNotBefore) {
  RendezvousState s(make_config(2, 4));
  auto a = join(s, node("a"));
  advance(5s);
  auto b = join(s, node("b"));  // the min-th join starts the 30 s last call
  advance(29s);
  s.tick(now);
  EXPECT_FALSE(s.join_status(a, now).has_value());
  auto c = join(s, node("c"));  // still welcome during the last call
  advance(1s);
  EXPECT_EQ(joined(s, a).group_world_size, 3);
  EXPECT_EQ(joined(s, b).group_world_size, 3);
  EXPECT_EQ(joined(s, c).world_size, 3);
}

TEST_F(RendezvousStateTest, ElasticRoundClosesImmediatelyAtMax) {
  RendezvousState s(make_config(1, 2));
  auto a = join(s, node("a"));
  EXPECT_FALSE(s.join_status(a, now).has_value());
  auto b = join(s, node("b"));
  EXPECT_EQ(joined(s, a).group_world_size, 2);
  EXPECT_EQ(joined(s, b).group_rank, 1);
}

TEST_F(RendezvousStateTest, ElasticRoundFailsWhenExplicitRankIsOutsideTheGroup) {
  RendezvousState s(make_config(1, 4));
  auto t = join(s, node("far", 1, 3));
  advance(30s);
  auto r = join_refusal(s, t);
  EXPECT_EQ(r.code, RpcCode::kAborted);
  EXPECT_THAT(r.message, HasSubstr("node rank 3 (host 'far')"));
  EXPECT_THAT(r.message, HasSubstr("closed with 1 nodes"));
  // The discarded round used no number: the next one to form is round 1.
  auto again = join(s, node("near", 1, 0));
  advance(30s);
  EXPECT_EQ(joined(s, again).round, 1);
}

TEST_F(RendezvousStateTest, JoinTimesOutNamingMissingNodeRanks) {
  RendezvousState s(make_config(3, 3));
  RendezvousConfig c = s.config();
  auto a = join(s, node("a", 1, 1));
  advance(c.join_timeout - 1ms);
  EXPECT_FALSE(s.join_status(a, now).has_value());
  auto b = join(s, node("b"));  // takes the lowest free rank, 0
  advance(1ms);
  for (auto t : {a, b}) {
    auto r = join_refusal(s, t);
    EXPECT_EQ(r.code, RpcCode::kDeadlineExceeded);
    EXPECT_THAT(r.message,
                HasSubstr("rendezvous join timed out after 600.0s: 2 of 3 nodes joined"));
    EXPECT_THAT(r.message, HasSubstr("missing node rank 2;"));
    EXPECT_THAT(r.message, HasSubstr("joined: 'a', 'b'"));
  }
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kForming);
  EXPECT_EQ(s.current_round(), 0);
}

TEST_F(RendezvousStateTest, CancelledJoinLeavesTheFormingRound) {
  RendezvousState s(make_config(2, 2));
  auto gone = join(s, node("gone"));
  s.cancel(gone);
  EXPECT_EQ(join_refusal(s, gone).code, RpcCode::kNotFound);
  auto a = join(s, node("a"));
  EXPECT_FALSE(s.join_status(a, now).has_value()) << "the cancelled node must not count";
  auto b = join(s, node("b"));
  EXPECT_EQ(joined(s, a).group_world_size, 2);
  joined(s, b);
}

TEST_F(RendezvousStateTest, AnsweredJoinTicketIsConsumed) {
  RendezvousState s(make_config(1, 1));
  auto t = join(s, node("a"));
  joined(s, t);
  EXPECT_EQ(join_refusal(s, t).code, RpcCode::kNotFound);
}

// --- Running rounds, failures and restarts -------------------------------------

TEST_F(RendezvousStateTest, HeartbeatsKeepNodesAlive) {
  RendezvousState s(make_config(2, 2));
  form(s, 2);
  for (int i = 0; i < 5; ++i) {
    advance(20s);
    for (int rank : {0, 1}) {
      EXPECT_FALSE(s.heartbeat(kAuth, 1, rank, now).round_ended);
    }
  }
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kRunning);
}

TEST_F(RendezvousStateTest, HeartbeatExpiryEndsTheRoundNamingTheNode) {
  RendezvousState s(make_config(2, 2));
  form(s, 2);
  advance(20s);
  ASSERT_NO_THROW(s.heartbeat(kAuth, 1, 0, now));
  advance(10s);  // node 1: 30 s silent since the round formed
  auto r = s.heartbeat(kAuth, 1, 0, now);
  EXPECT_TRUE(r.round_ended);
  EXPECT_EQ(r.reason, "node 1 (host 'host1') stopped sending heartbeats for 30.0s");
  EXPECT_FALSE(r.can_restart);
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kFailed);
}

TEST_F(RendezvousStateTest, HeartbeatRejectsUnknownRoundAndGroupRank) {
  RendezvousState s(make_config(1, 1));
  form(s, 1);
  EXPECT_EQ(refused([&] { s.heartbeat(kAuth, 2, 0, now); }).code, RpcCode::kNotFound);
  EXPECT_EQ(refused([&] { s.heartbeat(kAuth, 0, 0, now); }).code, RpcCode::kNotFound);
  auto r = refused([&] { s.heartbeat(kAuth, 1, 1, now); });
  EXPECT_EQ(r.code, RpcCode::kInvalidArgument);
  EXPECT_THAT(r.message, HasSubstr("group rank 1 is not in round 1"));
}

TEST_F(RendezvousStateTest, ReportFailureFirstWins) {
  RendezvousState s(make_config(2, 2, 1));
  form(s, 2);
  EXPECT_TRUE(s.report_failure(kAuth, 1, 1, "rank 3 crashed", 3, now));
  ASSERT_NO_THROW(s.report_failure(kAuth, 1, 0, "rank 0 was stopped", 143, now));
  auto hb = s.heartbeat(kAuth, 1, 0, now);
  EXPECT_TRUE(hb.round_ended);
  EXPECT_FALSE(hb.succeeded);
  EXPECT_EQ(hb.reason, "rank 3 crashed");
  EXPECT_TRUE(hb.can_restart);
}

TEST_F(RendezvousStateTest, RestartBudgetIsCountedOncePerRoundJobWide) {
  RendezvousState s(make_config(2, 2, 2));
  form(s, 2);
  ASSERT_NO_THROW(s.report_failure(kAuth, 1, 0, "boom", 1, now));
  ASSERT_NO_THROW(s.report_failure(kAuth, 1, 1, "boom too", 1, now));
  ASSERT_NO_THROW(s.leave(kAuth, 1, 1, 1, now));
  EXPECT_EQ(s.restarts_used(), 1);
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kForming);
}

TEST_F(RendezvousStateTest, NewRoundsGetNextNumberAndRestartCount) {
  RendezvousState s(make_config(2, 2, 2));
  form(s, 2);
  ASSERT_NO_THROW(s.report_failure(kAuth, 1, 0, "boom", 1, now));
  auto a = join(s, node("a"));
  auto b = join(s, node("b"));
  RoundAssignment r = joined(s, a);
  EXPECT_EQ(r.round, 2);
  EXPECT_EQ(r.restart_count, 1);
  joined(s, b);
  // A straggler of round 1 learns it is over; round 2 runs on.
  EXPECT_TRUE(s.heartbeat(kAuth, 1, 1, now).round_ended);
  EXPECT_FALSE(s.heartbeat(kAuth, 2, 1, now).round_ended);
}

TEST_F(RendezvousStateTest, NoRestartOnceBudgetIsSpent) {
  RendezvousState s(make_config(1, 1, 1));
  form(s, 1);
  EXPECT_TRUE(s.report_failure(kAuth, 1, 0, "first failure", 1, now));
  auto t = join(s, node("a"));
  EXPECT_EQ(joined(s, t).restart_count, 1);
  EXPECT_FALSE(s.report_failure(kAuth, 2, 0, "second failure", 1, now)) << "no restart left";
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kFailed);
  auto r = refused([&] { s.join(kAuth, node("a"), now); });
  EXPECT_EQ(r.code, RpcCode::kFailedPrecondition);
  EXPECT_THAT(r.message, HasSubstr("second failure"));
}

TEST_F(RendezvousStateTest, LeaveOfEveryNodeWithZeroCompletesTheJob) {
  RendezvousState s(make_config(2, 2));
  form(s, 2);
  ASSERT_NO_THROW(s.leave(kAuth, 1, 0, 0, now));
  for (int i = 0; i < 2; ++i) {  // node 0 has left, so its silence is fine
    advance(20s);
    ASSERT_FALSE(s.heartbeat(kAuth, 1, 1, now).round_ended);
  }
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kRunning);
  ASSERT_NO_THROW(s.leave(kAuth, 1, 1, 0, now));
  ASSERT_NO_THROW(s.leave(kAuth, 1, 1, 0, now)) << "leaving twice is a no-op";
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kSucceeded);
  EXPECT_FALSE(s.next_deadline().has_value());
  EXPECT_EQ(refused([&] { s.join(kAuth, node("a"), now); }).code, RpcCode::kFailedPrecondition);
}

TEST_F(RendezvousStateTest, LeaveWithNonZeroExitEndsTheRound) {
  RendezvousState s(make_config(2, 2));
  form(s, 2);
  ASSERT_NO_THROW(s.leave(kAuth, 1, 1, 7, now));
  auto hb = s.heartbeat(kAuth, 1, 0, now);
  EXPECT_TRUE(hb.round_ended);
  EXPECT_EQ(hb.reason, "node 1 (host 'host1') left with exit code 7");
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kFailed);
}

// --- Store ---------------------------------------------------------------------

TEST_F(RendezvousStateTest, StoreSetGetRemoveAndCount) {
  RendezvousState s(make_config(1, 1));
  EXPECT_FALSE(s.get(kAuth, "k").has_value());
  ASSERT_NO_THROW(s.set(kAuth, "run1/round1/nccl_id", std::string("a\0b", 3)));
  ASSERT_NO_THROW(s.set(kAuth, "k", "v1"));
  ASSERT_NO_THROW(s.set(kAuth, "k", "v2"));
  EXPECT_EQ(s.get(kAuth, "run1/round1/nccl_id"), std::string("a\0b", 3));
  EXPECT_EQ(s.get(kAuth, "k"), "v2");
  EXPECT_EQ(s.num_keys(kAuth), 2);
  EXPECT_TRUE(s.remove(kAuth, "k"));
  EXPECT_FALSE(s.remove(kAuth, "k"));
  EXPECT_EQ(s.num_keys(kAuth), 1);
}

TEST_F(RendezvousStateTest, StoreCheckTellsWhetherAllKeysExist) {
  RendezvousState s(make_config(1, 1));
  ASSERT_NO_THROW(s.set(kAuth, "a/1", "x"));
  EXPECT_TRUE(s.check(kAuth, {}));
  EXPECT_TRUE(s.check(kAuth, {"a/1"}));
  EXPECT_FALSE(s.check(kAuth, {"a/1", "a/2"}));
  EXPECT_EQ(refused([&] { s.check(kAuth, {"a/1", ""}); }).code, RpcCode::kInvalidArgument);
}

TEST_F(RendezvousStateTest, StoreAddCountsInDecimalInt64) {
  RendezvousState s(make_config(1, 1));
  EXPECT_EQ(s.add(kAuth, "n", 5), 5);
  EXPECT_EQ(s.add(kAuth, "n", -7), -2);
  EXPECT_EQ(s.get(kAuth, "n"), "-2");
  ASSERT_NO_THROW(s.set(kAuth, "n", "40"));
  EXPECT_EQ(s.add(kAuth, "n", 2), 42);
}

TEST_F(RendezvousStateTest, StoreAddRejectsNonIntegerAndOverflow) {
  RendezvousState s(make_config(1, 1));
  ASSERT_NO_THROW(s.set(kAuth, "text", "12abc"));
  auto r = refused([&] { s.add(kAuth, "text", 1); });
  EXPECT_EQ(r.code, RpcCode::kInvalidArgument);
  EXPECT_THAT(r.message, HasSubstr("key 'text'"));
  ASSERT_NO_THROW(s.set(kAuth, "big", "9223372036854775807"));
  auto o = refused([&] { s.add(kAuth, "big", 1); });
  EXPECT_EQ(o.code, RpcCode::kInvalidArgument);
  EXPECT_THAT(o.message, HasSubstr("overflows"));
  EXPECT_EQ(s.get(kAuth, "big"), "9223372036854775807");
}

TEST_F(RendezvousStateTest, StoreCompareSetFollowsTorchSemantics) {
  RendezvousState s(make_config(1, 1));
  auto missing = s.compare_set(kAuth, "k", "x", "y");
  EXPECT_FALSE(missing.swapped);
  EXPECT_EQ(missing.current, "");
  EXPECT_FALSE(s.get(kAuth, "k").has_value());
  auto create = s.compare_set(kAuth, "k", "", "first");
  EXPECT_TRUE(create.swapped);
  EXPECT_EQ(create.current, "first");
  auto wrong = s.compare_set(kAuth, "k", "nope", "second");
  EXPECT_FALSE(wrong.swapped);
  EXPECT_EQ(wrong.current, "first");
  auto right = s.compare_set(kAuth, "k", "first", "second");
  EXPECT_TRUE(right.swapped);
  EXPECT_EQ(s.get(kAuth, "k"), "second");
}

TEST_F(RendezvousStateTest, StoreRejectsEmptyAndOversizedKeys) {
  RendezvousConfig c = make_config(1, 1);
  c.limits.max_key_bytes = 8;
  RendezvousState s(c);
  EXPECT_EQ(refused([&] { s.set(kAuth, "", "v"); }).code, RpcCode::kInvalidArgument);
  EXPECT_NO_THROW(s.set(kAuth, "12345678", "v"));
  Refusal big = refused([&] { s.set(kAuth, "123456789", "v"); });
  EXPECT_EQ(big.code, RpcCode::kInvalidArgument);
  EXPECT_EQ(big.message, "key '123456789' is 9 bytes, limit 8");
  EXPECT_EQ(refused([&] { s.get(kAuth, "123456789"); }).code, RpcCode::kInvalidArgument);
  EXPECT_EQ(refused([&] { s.add(kAuth, "123456789", 1); }).code, RpcCode::kInvalidArgument);
  EXPECT_EQ(refused([&] { s.remove(kAuth, "123456789"); }).code, RpcCode::kInvalidArgument);
}

TEST_F(RendezvousStateTest, StoreKeyInMessagesIsShortenedAndEscaped) {
  RendezvousState s(make_config(1, 1));
  Refusal big = refused([&] { s.set(kAuth, std::string(5000, 'k'), "v"); });
  EXPECT_EQ(big.message, "key '" + std::string(40, 'k') + "...' is 5000 bytes, limit 4096");
  ASSERT_NO_THROW(s.set(kAuth, std::string("\x01z", 2), "abc"));
  EXPECT_THAT(refused([&] { s.add(kAuth, std::string("\x01z", 2), 1); }).message,
              HasSubstr("'\\x01z'"));
}

TEST_F(RendezvousStateTest, StoreRejectsOversizedValues) {
  RendezvousConfig c = make_config(1, 1);
  c.limits.max_value_bytes = 4;
  RendezvousState s(c);
  EXPECT_NO_THROW(s.set(kAuth, "k", "1234"));
  Refusal big = refused([&] { s.set(kAuth, "k", "12345"); });
  EXPECT_EQ(big.code, RpcCode::kInvalidArgument);
  EXPECT_EQ(big.message, "value of key 'k' is 5 bytes, limit 4");
  EXPECT_EQ(refused([&] { s.compare_set(kAuth, "k", "1234", "12345"); }).code,
            RpcCode::kInvalidArgument);
  EXPECT_EQ(s.get(kAuth, "k"), "1234");
}

TEST_F(RendezvousStateTest, StoreRejectsNewKeysBeyondTheLimitButUpdatesExisting) {
  RendezvousConfig c = make_config(1, 1);
  c.limits.max_keys = 2;
  RendezvousState s(c);
  ASSERT_NO_THROW(s.set(kAuth, "a", "1"));
  ASSERT_NO_THROW(s.set(kAuth, "b", "1"));
  Refusal full = refused([&] { s.set(kAuth, "c", "1"); });
  EXPECT_EQ(full.code, RpcCode::kResourceExhausted);
  EXPECT_EQ(full.message,
            "cannot add key 'c': the store holds 2 keys, limit 2 (--rdzv_conf max_keys)");
  EXPECT_EQ(refused([&] { s.add(kAuth, "c", 1); }).code, RpcCode::kResourceExhausted);
  EXPECT_EQ(refused([&] { s.compare_set(kAuth, "c", "", "1"); }).code, RpcCode::kResourceExhausted);
  EXPECT_NO_THROW(s.set(kAuth, "a", "2"));
  EXPECT_EQ(s.add(kAuth, "b", 1), 2);
  EXPECT_EQ(s.num_keys(kAuth), 2);
}

TEST_F(RendezvousStateTest, VersionCountsStoreMutationsOnly) {
  RendezvousState s(make_config(1, 1));
  auto v = s.version();
  ASSERT_NO_THROW(s.set(kAuth, "k", "1"));
  EXPECT_GT(s.version(), v);
  v = s.version();
  s.get(kAuth, "k");
  s.check(kAuth, {"k"});
  s.num_keys(kAuth);
  s.remove(kAuth, "missing");
  s.compare_set(kAuth, "k", "wrong", "x");
  EXPECT_EQ(s.version(), v) << "reads and failed swaps change nothing";
  s.add(kAuth, "k", 1);
  EXPECT_GT(s.version(), v);
  v = s.version();
  s.remove(kAuth, "k");
  EXPECT_GT(s.version(), v);
}

// --- Authentication of every operation ------------------------------------------

// Every operation kind, called with `auth`.
std::vector<std::pair<std::string, std::function<void(RendezvousState&, const Auth&, TimePoint)>>>
every_operation() {
  return {
      {"join", [](auto& s, auto& a, auto t) { s.join(a, node("x"), t); }},
      {"heartbeat", [](auto& s, auto& a, auto t) { s.heartbeat(a, 1, 0, t); }},
      {"report_failure", [](auto& s, auto& a, auto t) { s.report_failure(a, 1, 0, "bad", 1, t); }},
      {"leave", [](auto& s, auto& a, auto t) { s.leave(a, 1, 0, 1, t); }},
      {"set", [](auto& s, auto& a, auto) { s.set(a, "k", "new"); }},
      {"get", [](auto& s, auto& a, auto) { s.get(a, "k"); }},
      {"add", [](auto& s, auto& a, auto) { s.add(a, "n", 1); }},
      {"compare_set", [](auto& s, auto& a, auto) { s.compare_set(a, "k", "old", "x"); }},
      {"check", [](auto& s, auto& a, auto) { s.check(a, {"k"}); }},
      {"remove", [](auto& s, auto& a, auto) { s.remove(a, "k"); }},
      {"num_keys", [](auto& s, auto& a, auto) { s.num_keys(a); }},
      {"barrier", [](auto& s, auto& a, auto t) { s.barrier_arrive(a, "b", 0, 1, "h", t + 1s, t); }},
  };
}

TEST_F(RendezvousStateTest, EveryOperationRejectsWrongTokenAndChangesNothing) {
  for (const auto& [name, op] : every_operation()) {
    for (const Auth& bad : {Auth{"run1", "wrong"}, Auth{"run1", ""}, Auth{"other", "wrong"}}) {
      RendezvousState s(make_config(2, 2));
      form(s, 2);
      ASSERT_NO_THROW(s.set(kAuth, "k", "old"));
      const auto version = s.version();
      const auto deadline = s.next_deadline();
      // Late enough that a tick would expire both nodes' heartbeats.
      Refusal status = refused([&] { op(s, bad, now + 1h); });
      EXPECT_EQ(status.code, RpcCode::kUnauthenticated) << name;
      EXPECT_THAT(status.message, HasSubstr("rendezvous token")) << name;
      EXPECT_EQ(s.version(), version) << name;
      EXPECT_EQ(s.next_deadline(), deadline) << name;
      EXPECT_EQ(s.phase(), RendezvousState::Phase::kRunning) << name;
      EXPECT_EQ(s.get(kAuth, "k"), "old") << name;
      EXPECT_EQ(s.num_keys(kAuth), 1) << name;
    }
  }
}

TEST_F(RendezvousStateTest, EveryOperationRejectsMismatchedRunIdAndChangesNothing) {
  for (const auto& [name, op] : every_operation()) {
    RendezvousState s(make_config(2, 2));
    form(s, 2);
    const auto version = s.version();
    Refusal status = refused([&] { op(s, Auth{"run2", "secret"}, now + 1h); });
    EXPECT_EQ(status.code, RpcCode::kInvalidArgument) << name;
    EXPECT_EQ(status.message, "run id 'run2' does not match this server's run 'run1'") << name;
    EXPECT_EQ(s.version(), version) << name;
    EXPECT_EQ(s.phase(), RendezvousState::Phase::kRunning) << name;
    EXPECT_EQ(s.num_keys(kAuth), 0) << name;
  }
}

// --- Barriers --------------------------------------------------------------------

TEST_F(RendezvousStateTest, BarrierCompletesWhenAllRanksArrive) {
  RendezvousState s(make_config(1, 1));
  auto t0 = arrive(s, "init", 0, 3);
  auto t2 = arrive(s, "init", 2, 3);
  EXPECT_FALSE(s.barrier_passed(t0, now));
  advance(1s);
  auto t1 = arrive(s, "init", 1, 3);
  for (auto t : {t0, t1, t2}) {
    EXPECT_TRUE(s.barrier_passed(t, now));
  }
  EXPECT_EQ(refused([&] { s.barrier_passed(t0, now); }).code, RpcCode::kNotFound)
      << "answered tickets are consumed";
  EXPECT_FALSE(s.next_deadline().has_value());
}

TEST_F(RendezvousStateTest, BarrierOfOneCompletesAtOnce) {
  RendezvousState s(make_config(1, 1));
  auto t = arrive(s, "solo", 0, 1);
  EXPECT_TRUE(s.barrier_passed(t, now));
}

TEST_F(RendezvousStateTest, BarrierTimeoutNamesMissingRanksAndArrivedHosts) {
  RendezvousState s(make_config(1, 1));
  auto t0 = arrive(s, "init", 0, 4, 2s);
  arrive(s, "init", 2, 4, 5s);
  advance(2s);
  auto r = refused([&] { s.barrier_passed(t0, now); });
  EXPECT_EQ(r.code, RpcCode::kDeadlineExceeded);
  EXPECT_EQ(r.message,
            "barrier 'init' timed out after 2.0s: ranks 1, 3 never arrived "
            "(arrived: rank 0 on 'h0', rank 2 on 'h2')");
}

TEST_F(RendezvousStateTest, BarrierTimeoutReportsRanksMissingAtThatMoment) {
  RendezvousState s(make_config(1, 1));
  arrive(s, "b", 0, 3, 2s);
  auto t1 = arrive(s, "b", 1, 3, 5s);
  advance(2s);
  s.tick(now);  // rank 0 gives up and is withdrawn
  advance(1s);
  auto t2 = arrive(s, "b", 2, 3, 5s);
  EXPECT_FALSE(s.barrier_passed(t2, now)) << "rank 0 no longer waits";
  advance(2s);
  auto r = refused([&] { s.barrier_passed(t1, now); });
  EXPECT_EQ(r.code, RpcCode::kDeadlineExceeded);
  EXPECT_EQ(r.message,
            "barrier 'b' timed out after 5.0s: rank 0 arrived but timed out first "
            "(arrived: rank 1 on 'h1', rank 2 on 'h2')");
}

TEST_F(RendezvousStateTest, BarrierTimeoutSummarisesLargeWorlds) {
  RendezvousState s(make_config(1, 1));
  for (int rank = 0; rank < 1000; rank += 2) {
    ASSERT_NO_THROW(s.barrier_arrive(kAuth, "big", rank, 1 << 20,
                                     "node" + std::to_string(rank / 500), now + 1s, now));
  }
  auto t = arrive(s, "big", 1001, 1 << 20, 1s);
  advance(1s);
  auto r = refused([&] { s.barrier_passed(t, now); });
  EXPECT_THAT(r.message, HasSubstr("ranks 1, 3, 5,"));
  EXPECT_THAT(r.message, HasSubstr("... (1048075 in all) never arrived"));
  EXPECT_THAT(r.message, HasSubstr("ranks 0, 2, 4,"));
  EXPECT_LT(r.message.size(), 1000u);
}

TEST_F(RendezvousStateTest, BarrierRejectsWorldSizeMismatch) {
  RendezvousState s(make_config(1, 1));
  arrive(s, "b", 0, 3);
  auto r = refused([&] { s.barrier_arrive(kAuth, "b", 1, 4, "h", now + 1s, now); });
  EXPECT_EQ(r.code, RpcCode::kInvalidArgument);
  EXPECT_EQ(r.message, "barrier 'b': rank 1 gives world size 4, earlier ranks gave 3");
}

TEST_F(RendezvousStateTest, BarrierRejectsRankTwiceAndRankOutOfRange) {
  RendezvousState s(make_config(1, 1));
  arrive(s, "b", 1, 3);
  auto twice = refused([&] { s.barrier_arrive(kAuth, "b", 1, 3, "again", now + 1s, now); });
  EXPECT_EQ(twice.code, RpcCode::kInvalidArgument);
  EXPECT_THAT(twice.message, HasSubstr("rank 1 arrived twice (first from host 'h1')"));
  EXPECT_EQ(refused([&] { s.barrier_arrive(kAuth, "b", 3, 3, "h", now + 1s, now); }).code,
            RpcCode::kInvalidArgument);
  EXPECT_EQ(refused([&] { s.barrier_arrive(kAuth, "b", -1, 3, "h", now + 1s, now); }).code,
            RpcCode::kInvalidArgument);
  EXPECT_EQ(refused([&] { s.barrier_arrive(kAuth, "", 0, 3, "h", now + 1s, now); }).code,
            RpcCode::kInvalidArgument);
}

TEST_F(RendezvousStateTest, BarrierNameCanBeReused) {
  RendezvousState s(make_config(1, 1));
  for (int generation = 0; generation < 3; ++generation) {
    auto a = arrive(s, "step", 0, 2);
    auto b = arrive(s, "step", 1, 2);
    EXPECT_TRUE(s.barrier_passed(a, now));
    EXPECT_TRUE(s.barrier_passed(b, now));
  }
  auto next = arrive(s, "step", 0, 5);  // a new generation may even change size
  EXPECT_FALSE(s.barrier_passed(next, now));
}

TEST_F(RendezvousStateTest, BarrierLimitsOpenBarriersAndWorldSize) {
  RendezvousConfig c = make_config(1, 1);
  c.limits.max_open_barriers = 2;
  c.limits.max_world_size = 8;
  RendezvousState s(c);
  arrive(s, "one", 0, 2);
  auto two = arrive(s, "two", 0, 2);
  auto r = refused([&] { s.barrier_arrive(kAuth, "three", 0, 2, "h", now + 1s, now); });
  EXPECT_EQ(r.code, RpcCode::kResourceExhausted);
  EXPECT_THAT(r.message, HasSubstr("2 barriers are open, limit 2"));
  EXPECT_NO_THROW(s.barrier_arrive(kAuth, "two", 1, 2, "h", now + 1s, now))
      << "joining an open one is fine";
  EXPECT_TRUE(s.barrier_passed(two, now));
  EXPECT_NO_THROW(s.barrier_arrive(kAuth, "three", 0, 2, "h", now + 1s, now)) << "room again";
  auto huge = refused([&] { s.barrier_arrive(kAuth, "huge", 0, 9, "h", now + 1s, now); });
  EXPECT_EQ(huge.code, RpcCode::kInvalidArgument);
  EXPECT_THAT(huge.message, HasSubstr("world size 9 is outside [1, 8]"));
}

TEST_F(RendezvousStateTest, CancelledBarrierTicketWithdrawsItsRank) {
  RendezvousState s(make_config(1, 1));
  auto gone = arrive(s, "b", 0, 2);
  s.cancel(gone);
  EXPECT_FALSE(s.next_deadline().has_value());
  auto t1 = arrive(s, "b", 1, 2);
  EXPECT_FALSE(s.barrier_passed(t1, now));
  auto t0 = arrive(s, "b", 0, 2);  // may arrive again: it was withdrawn
  EXPECT_TRUE(s.barrier_passed(t0, now));
}

// --- Deadlines ---------------------------------------------------------------------

TEST_F(RendezvousStateTest, NextDeadlineFollowsWhatWaits) {
  RendezvousConfig c = make_config(2, 3);
  c.join_timeout = 100s;
  c.last_call_timeout = 10s;
  c.heartbeat_timeout = 20s;
  RendezvousState s(c);
  EXPECT_FALSE(s.next_deadline().has_value());

  const TimePoint start = now;
  join(s, node("a"));
  EXPECT_EQ(s.next_deadline(), start + 100s);  // join timeout
  advance(5s);
  join(s, node("b"));
  EXPECT_EQ(s.next_deadline(), start + 15s);  // last call
  arrive(s, "b", 0, 2, 3s);
  EXPECT_EQ(s.next_deadline(), start + 8s);  // the barrier ticket is sooner

  advance(3s);
  s.tick(now);  // the barrier ticket expires
  EXPECT_EQ(s.next_deadline(), start + 15s);
  advance(7s);
  s.tick(now);  // the round closes at start + 15s
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kRunning);
  EXPECT_EQ(s.next_deadline(), start + 35s);  // heartbeats
  advance(5s);
  ASSERT_NO_THROW(s.heartbeat(kAuth, 1, 0, now));
  EXPECT_EQ(s.next_deadline(), start + 35s) << "node 1 is still due first";
  ASSERT_NO_THROW(s.heartbeat(kAuth, 1, 1, now));
  EXPECT_EQ(s.next_deadline(), start + 40s);
  ASSERT_NO_THROW(s.report_failure(kAuth, 1, 0, "boom", 1, now));
  EXPECT_FALSE(s.next_deadline().has_value());
}

TEST(RendezvousConfigTest, ConstructorRejectsInconsistentConfig) {
  RendezvousConfig c = make_config(3, 2);
  EXPECT_THROW(RendezvousState{c}, ddp::Error);
  c = make_config(0, 2);
  EXPECT_THROW(RendezvousState{c}, ddp::Error);
  c = make_config(1, 1);
  c.heartbeat_timeout = 0s;
  EXPECT_THROW(RendezvousState{c}, ddp::Error);
  c = make_config(1, 1, -1);
  EXPECT_THROW(RendezvousState{c}, ddp::Error);
  c = make_config(1, 1);
  c.run_id = "";
  EXPECT_THROW(RendezvousState{c}, ddp::Error);
  c = make_config(1, 1);
  c.token = "";  // an unauthenticated rendezvous
  EXPECT_NO_THROW(RendezvousState{c});
  c = make_config(1, 1);
  c.join_timeout = std::chrono::hours(24 * 366);
  EXPECT_THROW(RendezvousState{c}, ddp::Error);
  c = make_config(1, 1);
  c.last_call_timeout = 0s;
  EXPECT_NO_THROW(RendezvousState{c});
}

TEST(RendezvousStateBarrierGaveUp, LaterTimeoutsDoNotNameRanksThatArrivedAndGaveUpFirst) {
  RendezvousConfig config;
  config.run_id = "run";
  config.token = "tok";
  RendezvousState state(config);
  const Auth auth{"run", "tok"};
  TimePoint t0{};
  auto first = state.barrier_arrive(auth, "b", 0, 3, "h0", t0 + std::chrono::seconds(1), t0);
  auto second = state.barrier_arrive(auth, "b", 1, 3, "h1", t0 + std::chrono::milliseconds(1500),
                                     t0 + std::chrono::milliseconds(500));
  auto a = refused([&] { state.barrier_passed(first, t0 + std::chrono::seconds(1)); });
  EXPECT_THAT(a.message, HasSubstr("rank 2 never arrived"));
  auto b = refused([&] { state.barrier_passed(second, t0 + std::chrono::milliseconds(1500)); });
  EXPECT_THAT(b.message, HasSubstr("rank 2 never arrived"));
  EXPECT_THAT(b.message, HasSubstr("rank 0 arrived but timed out first"));
}

}  // namespace
}  // namespace rendezvous_test
}  // namespace ddp::launcher
