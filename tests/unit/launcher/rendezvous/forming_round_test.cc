// FormingRound on its own: when the round that nodes are joining closes or
// is discarded, and which group rank each joiner gets.

#include "rendezvous/forming_round.h"

#include "rendezvous_state_fixture.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ddp::launcher {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

using rendezvous_test::make_config;
using rendezvous_test::node;

// Rounds whose last call and join timeout are short enough to reason about.
RendezvousConfig config_of(int min_nodes, int max_nodes) {
  RendezvousConfig c = make_config(min_nodes, max_nodes);
  c.join_timeout = 60s;
  c.last_call_timeout = 10s;
  return c;
}

const TimePoint t0 = TimePoint{} + 1000h;

TEST(FormingRound, ClosesAtMaxNodes) {
  const RendezvousConfig c = config_of(1, 2);
  FormingRound f(c);
  EXPECT_EQ(f.due(t0), FormingRound::Due::kNothing) << "nobody joined";
  f.add(node("a"), 1, t0);
  f.add(node("b"), 2, t0);
  EXPECT_EQ(f.due(t0), FormingRound::Due::kClose);
}

TEST(FormingRound, ClosesAtTheEndOfTheLastCallAndIsDiscardedAtTheJoinTimeout) {
  const RendezvousConfig c = config_of(2, 4);
  FormingRound f(c);
  f.add(node("a"), 1, t0);
  EXPECT_EQ(f.next_deadline(), t0 + 60s) << "below MIN: only the join timeout";
  f.add(node("b"), 2, t0 + 5s);  // MIN in: the last call runs 10 s
  EXPECT_EQ(f.next_deadline(), t0 + 15s);
  EXPECT_EQ(f.due(t0 + 14s), FormingRound::Due::kNothing);
  EXPECT_EQ(f.due(t0 + 15s), FormingRound::Due::kClose);

  FormingRound short_of_min(c);
  short_of_min.add(node("a", 1, 1), 1, t0);
  EXPECT_EQ(short_of_min.due(t0 + 60s), FormingRound::Due::kDiscard);
  const RpcError why = short_of_min.timeout_refusal();
  EXPECT_TRUE(why.is(RpcCode::kDeadlineExceeded));
  EXPECT_THAT(why.what(), HasSubstr("1 of 2 nodes joined (--nnodes=2:4; missing node rank 0; "
                                    "joined: 'a')"));
}

TEST(FormingRound, KeepsExplicitRanksAndOrdersAutomaticOnesByHost) {
  const RendezvousConfig c = config_of(4, 4);
  FormingRound f(c);
  f.add(node("zeta"), 1, t0);
  f.add(node("host", 1, 2), 2, t0);
  f.add(node("alpha"), 3, t0);
  f.add(node("beta"), 4, t0);
  ASSERT_EQ(f.misfit(), std::nullopt);
  const std::vector<Member> ranked = f.close(t0 + 1s);
  ASSERT_EQ(ranked.size(), 4u);
  EXPECT_EQ(ranked[0].args.hostname, "alpha");
  EXPECT_EQ(ranked[1].args.hostname, "beta");
  EXPECT_EQ(ranked[2].args.hostname, "host");
  EXPECT_EQ(ranked[3].args.hostname, "zeta");
  EXPECT_EQ(ranked[0].last_seen, t0 + 1s) << "the round's start counts as a heartbeat";
  EXPECT_TRUE(f.members().empty());
  EXPECT_EQ(f.next_deadline(), std::nullopt);
}

TEST(FormingRound, RefusesAClaimedRankAnOversizedWorldAndARankThatDoesNotFit) {
  RendezvousConfig c = config_of(1, 3);
  c.limits.max_world_size = 4;
  FormingRound f(c);
  f.add(node("a", 2, 2), 1, t0);
  std::optional<RpcError> conflict = f.rank_conflict(node("b", 1, 2));
  ASSERT_TRUE(conflict.has_value());
  EXPECT_TRUE(conflict->is(RpcCode::kInvalidArgument));
  EXPECT_THAT(conflict->what(), HasSubstr("node rank 2 was given to two nodes: host 'a' and "
                                          "host 'b'"));
  EXPECT_EQ(f.rank_conflict(node("b")), std::nullopt);
  try {
    f.add(node("b", 3), 2, t0);
    ADD_FAILURE() << "a world of 5 was accepted";
  } catch (const RpcError& e) {
    EXPECT_TRUE(e.is(RpcCode::kResourceExhausted));
  }
  EXPECT_EQ(f.members().size(), 1u) << "a refusal adds nothing";
  std::optional<RpcError> misfit = f.misfit();  // 1 node joined: rank 2 cannot be
  ASSERT_TRUE(misfit.has_value());
  EXPECT_TRUE(misfit->is(RpcCode::kAborted));
  EXPECT_TRUE(f.remove(1));
  EXPECT_FALSE(f.remove(1));
  EXPECT_EQ(f.broken_invariant(), "");
}

}  // namespace
}  // namespace ddp::launcher
