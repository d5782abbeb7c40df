// RendezvousState driven by hand: running rounds (heartbeats, failures,
// restarts, leaving), the token and run id every operation checks, and the
// deadlines of waits, on a fake clock.

#include "rendezvous_state_fixture.h"

namespace ddp::launcher {
namespace rendezvous_test {
namespace {

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

// --- Authentication of every operation ------------------------------------------

// Every operation kind, called with `auth`.
std::vector<std::pair<std::string, std::function<void(RendezvousState&, const Auth&, TimePoint)>>>
every_operation() {
  return {
      {"join", [](auto& s, auto& a, auto t) { s.join(a, node("x"), t); }},
      {"heartbeat", [](auto& s, auto& a, auto t) { s.heartbeat(a, 1, 0, t); }},
      {"report_failure", [](auto& s, auto& a, auto t) { s.report_failure(a, 1, 0, "bad", 1, t); }},
      {"leave", [](auto& s, auto& a, auto t) { s.leave(a, 1, 0, 1, t); }},
      {"set", [](auto& s, auto& a, auto) { s.store(a).set("k", "new"); }},
      {"get", [](auto& s, auto& a, auto) { s.store(a).get("k"); }},
      {"add", [](auto& s, auto& a, auto) { s.store(a).add("n", 1); }},
      {"compare_set", [](auto& s, auto& a, auto) { s.store(a).compare_set("k", "old", "x"); }},
      {"check", [](auto& s, auto& a, auto) { s.store(a).check({"k"}); }},
      {"remove", [](auto& s, auto& a, auto) { s.store(a).remove("k"); }},
      {"num_keys", [](auto& s, auto& a, auto) { s.store(a).size(); }},
      {"barrier",
       [](auto& s, auto& a, auto t) { s.barriers(a, t).arrive("b", 0, 1, "h", t + 1s, t); }},
  };
}

TEST_F(RendezvousStateTest, EveryOperationRejectsWrongTokenAndChangesNothing) {
  for (const auto& [name, op] : every_operation()) {
    for (const Auth& bad : {Auth{"run1", "wrong"}, Auth{"run1", ""}, Auth{"other", "wrong"}}) {
      RendezvousState s(make_config(2, 2));
      form(s, 2);
      ASSERT_NO_THROW(s.store(kAuth).set("k", "old"));
      const auto version = s.version();
      const auto deadline = s.next_deadline();
      // Late enough that a tick would expire both nodes' heartbeats.
      Refusal status = refused([&] { op(s, bad, now + 1h); });
      EXPECT_EQ(status.code, RpcCode::kUnauthenticated) << name;
      EXPECT_THAT(status.message, HasSubstr("rendezvous token")) << name;
      EXPECT_EQ(s.version(), version) << name;
      EXPECT_EQ(s.next_deadline(), deadline) << name;
      EXPECT_EQ(s.phase(), RendezvousState::Phase::kRunning) << name;
      EXPECT_EQ(s.store(kAuth).get("k"), "old") << name;
      EXPECT_EQ(s.store(kAuth).size(), 1) << name;
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
    EXPECT_EQ(s.store(kAuth).size(), 0) << name;
  }
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
  auto first = state.barriers(auth, t0).arrive("b", 0, 3, "h0", t0 + std::chrono::seconds(1), t0);
  auto second = state.barriers(auth, t0 + std::chrono::milliseconds(500))
                    .arrive("b", 1, 3, "h1", t0 + std::chrono::milliseconds(1500),
                            t0 + std::chrono::milliseconds(500));
  auto a = refused([&] { state.barriers(auth, t0 + std::chrono::seconds(1)).passed(first); });
  EXPECT_THAT(a.message, HasSubstr("rank 2 never arrived"));
  auto b =
      refused([&] { state.barriers(auth, t0 + std::chrono::milliseconds(1500)).passed(second); });
  EXPECT_THAT(b.message, HasSubstr("rank 2 never arrived"));
  EXPECT_THAT(b.message, HasSubstr("rank 0 arrived but timed out first"));
}

}  // namespace
}  // namespace rendezvous_test
}  // namespace ddp::launcher
