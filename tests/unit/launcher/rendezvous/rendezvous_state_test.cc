// RendezvousState driven by hand: joining, rank assignment and closing a
// round, on a fake clock, tickets polled as the gRPC service polls them.

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
  ASSERT_NO_THROW(s.store(Auth{"run1", ""}).set("k", "v"));
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
  ASSERT_NO_THROW(s.store(kAuth).set("a", std::string(59, 'x')));  // 60 bytes with its key
  auto full = refused([&] { s.store(kAuth).set("b", std::string(59, 'y')); });
  EXPECT_EQ(full.code, RpcCode::kResourceExhausted);
  EXPECT_THAT(full.message,
              HasSubstr("the store would hold 120 bytes, limit 100 (--rdzv_conf max_store_bytes)"));
  EXPECT_EQ(refused([&] { s.store(kAuth).compare_set("b", "", std::string(59, 'y')); }).code,
            RpcCode::kResourceExhausted);
  ASSERT_NO_THROW(s.store(kAuth).set("a", std::string(90, 'z')))
      << "a replaced value frees its old bytes";
  EXPECT_EQ(refused([&] { s.store(kAuth).add("counter", 1); }).code, RpcCode::kResourceExhausted);
  ASSERT_TRUE(s.store(kAuth).remove("a"));
  ASSERT_NO_THROW(s.store(kAuth).set("b", std::string(59, 'y'))) << "a removed key frees its bytes";
  EXPECT_EQ(s.store(kAuth).add("counter", 5), 5);
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
                HasSubstr("rendezvous join timed out after 600.0s (--rdzv_conf join_timeout, or "
                          "timeout in the static form): 2 of 3 nodes joined"));
    EXPECT_THAT(r.message, HasSubstr("missing node rank 2;"));
    EXPECT_THAT(r.message, HasSubstr("joined: 'a', 'b'"));
  }
  EXPECT_EQ(s.phase(), RendezvousState::Phase::kForming);
  EXPECT_EQ(s.current_round(), 0);
}

// The join deadline bounds the last call too (as torch 2.x's c10d handler's):
// with MIN in but the last call ending after it, the round fails at the
// deadline on every node, saying so, instead of leaving the joins unanswered.
TEST_F(RendezvousStateTest, JoinTimesOutDuringALastCallThatEndsAfterIt) {
  RendezvousConfig c = make_config(1, 3);
  c.join_timeout = 5s;
  c.last_call_timeout = 30s;
  RendezvousState s(c);
  auto a = join(s, node("a"));
  EXPECT_EQ(s.next_deadline(), now + 5s);
  advance(2s);
  auto b = join(s, node("b"));
  advance(3s - 1ms);
  EXPECT_FALSE(s.join_status(a, now).has_value());
  advance(1ms);
  for (auto t : {a, b}) {
    auto r = join_refusal(s, t);
    EXPECT_EQ(r.code, RpcCode::kDeadlineExceeded);
    EXPECT_THAT(r.message, HasSubstr("rendezvous join timed out after 5.0s (--rdzv_conf "
                                     "join_timeout, or timeout in the static form): 2 of at most "
                                     "3 nodes joined (--nnodes=1:3; joined: 'a', 'b')"));
    EXPECT_THAT(r.message, HasSubstr("last call for more, which ends 30.0s after"));
    EXPECT_THAT(r.message, HasSubstr("(--rdzv_conf last_call_timeout)"));
  }
  EXPECT_EQ(s.current_round(), 0);
  // A last call that ends by the deadline closes the round.
  c.last_call_timeout = 5s;
  RendezvousState t(c);
  auto d = join(t, node("d"));
  advance(5s);
  EXPECT_EQ(joined(t, d).group_world_size, 1);
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

}  // namespace
}  // namespace rendezvous_test
}  // namespace ddp::launcher
