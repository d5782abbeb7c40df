// RoundFormation on its own: joins answered through their tickets, rounds
// formed and ended, restarts counted, and a misconfigured job refused.

#include "rendezvous/round_formation.h"

#include "rendezvous_state_fixture.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ddp::launcher {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

using rendezvous_test::make_config;

RendezvousConfig config_of(int nodes, int max_restarts) {
  return make_config(nodes, nodes, max_restarts);
}

// Two workers a node.
NodeInfo node(const std::string& host) { return rendezvous_test::node(host, 2); }

const TimePoint t0 = TimePoint{} + 1000h;

TEST(RoundFormation, FormsARoundWhenTheLastNodeJoins) {
  const RendezvousConfig c = config_of(2, 0);
  RoundFormation rounds(c);
  std::vector<std::int64_t> formed;
  rounds.on_round_formed([&](std::int64_t round) { formed.push_back(round); });
  const JoinTicket a = rounds.join(node("a"), t0, {});
  EXPECT_EQ(rounds.join_status(a), std::nullopt);
  EXPECT_EQ(rounds.running(), nullptr);
  const std::uint64_t before = rounds.changes();
  const JoinTicket b = rounds.join(node("b"), t0, {});
  EXPECT_GT(rounds.changes(), before);
  EXPECT_EQ(formed, std::vector<std::int64_t>{1});
  EXPECT_EQ(rounds.phase(), RendezvousPhase::kRunning);
  ASSERT_NE(rounds.running(), nullptr);
  const RoundAssignment second = rounds.join_status(b).value();
  EXPECT_EQ(second.round, 1);
  EXPECT_EQ(second.group_rank, 1);
  EXPECT_EQ(second.global_rank_offset, 2);
  EXPECT_EQ(second.world_size, 4);
  EXPECT_EQ(second.master_addr, "a.addr");
  EXPECT_EQ(second.member, b.id);
  try {
    rounds.join_status(b);
    ADD_FAILURE() << "the answer was given twice";
  } catch (const RpcError& e) {
    EXPECT_TRUE(e.is(RpcCode::kNotFound));
  }
  EXPECT_EQ(rounds.broken_invariant(), "");
}

TEST(RoundFormation, EndingARoundUsesARestartWhileAnyAreLeft) {
  const RendezvousConfig c = config_of(1, 1);
  RoundFormation rounds(c);
  rounds.join(node("a"), t0, {});
  rounds.end_round(rounds.find_member(1, 0), "first\nmore");
  EXPECT_EQ(rounds.restarts_used(), 1);
  EXPECT_EQ(rounds.phase(), RendezvousPhase::kForming);
  const JoinTicket again = rounds.join(node("a"), t0, {});
  EXPECT_EQ(rounds.join_status(again)->reason, "first") << "the reason's first line";
  rounds.end_round(rounds.find_member(2, 0), "second");
  rounds.end_round(rounds.find_member(2, 0), "ignored: the first end wins");
  EXPECT_EQ(rounds.phase(), RendezvousPhase::kFailed);
  EXPECT_EQ(rounds.find_member(2, 0).reason, "second");
  try {
    rounds.join(node("a"), t0, {});
    ADD_FAILURE() << "a failed job took a join";
  } catch (const RpcError& e) {
    EXPECT_TRUE(e.is(RpcCode::kFailedPrecondition));
    EXPECT_THAT(e.what(), HasSubstr("failed with no restarts left (max 1): second"));
  }
}

TEST(RoundFormation, AMisconfiguredJobFailsTheFormingRoundForGood) {
  const RendezvousConfig c = config_of(2, 0);
  RoundFormation rounds(c);
  const JoinTicket a = rounds.join(node("a"), t0, {});
  rounds.fail_forming(RpcError(RpcCode::kInvalidArgument, "host 'x' was refused: run id"));
  ASSERT_TRUE(rounds.misconfigured().has_value());
  try {
    rounds.join_status(a);
    ADD_FAILURE() << "the waiting joiner was not told";
  } catch (const RpcError& e) {
    EXPECT_THAT(e.what(), HasSubstr("was refused"));
  }
}

TEST(RoundFormation, AsksTheHealAdmissionOnlyWhileARoundRuns) {
  const RendezvousConfig c = config_of(1, 0);
  RoundFormation rounds(c);
  int asked = 0;
  auto heal = [&](Round& running) -> std::optional<JoinTicket> {
    ++asked;
    running.members.push_back(Member{node("b"), 99, 99, t0});
    return JoinTicket{99};
  };
  rounds.join(node("a"), t0, heal);
  EXPECT_EQ(asked, 0) << "nothing ran yet";
  EXPECT_EQ(rounds.join(node("b"), t0, heal).id, 99u);
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(rounds.phase(), RendezvousPhase::kRunning);
}

}  // namespace
}  // namespace ddp::launcher
