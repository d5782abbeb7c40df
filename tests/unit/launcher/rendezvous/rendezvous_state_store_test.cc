// RendezvousState driven by hand: the key-value store and the barriers, on a
// fake clock.

#include "rendezvous_state_fixture.h"

namespace ddp::launcher {
namespace rendezvous_test {
namespace {

// --- Store ---------------------------------------------------------------------

TEST_F(RendezvousStateTest, StoreSetGetRemoveAndCount) {
  RendezvousState s(make_config(1, 1));
  EXPECT_FALSE(s.store(kAuth).get("k").has_value());
  ASSERT_NO_THROW(s.store(kAuth).set("run1/round1/nccl_id", std::string("a\0b", 3)));
  ASSERT_NO_THROW(s.store(kAuth).set("k", "v1"));
  ASSERT_NO_THROW(s.store(kAuth).set("k", "v2"));
  EXPECT_EQ(s.store(kAuth).get("run1/round1/nccl_id"), std::string("a\0b", 3));
  EXPECT_EQ(s.store(kAuth).get("k"), "v2");
  EXPECT_EQ(s.store(kAuth).size(), 2);
  EXPECT_TRUE(s.store(kAuth).remove("k"));
  EXPECT_FALSE(s.store(kAuth).remove("k"));
  EXPECT_EQ(s.store(kAuth).size(), 1);
}

TEST_F(RendezvousStateTest, StoreCheckTellsWhetherAllKeysExist) {
  RendezvousState s(make_config(1, 1));
  ASSERT_NO_THROW(s.store(kAuth).set("a/1", "x"));
  EXPECT_TRUE(s.store(kAuth).check({}));
  EXPECT_TRUE(s.store(kAuth).check({"a/1"}));
  EXPECT_FALSE(s.store(kAuth).check({"a/1", "a/2"}));
  EXPECT_EQ(refused([&] { s.store(kAuth).check({"a/1", ""}); }).code, RpcCode::kInvalidArgument);
}

TEST_F(RendezvousStateTest, StoreAddCountsInDecimalInt64) {
  RendezvousState s(make_config(1, 1));
  EXPECT_EQ(s.store(kAuth).add("n", 5), 5);
  EXPECT_EQ(s.store(kAuth).add("n", -7), -2);
  EXPECT_EQ(s.store(kAuth).get("n"), "-2");
  ASSERT_NO_THROW(s.store(kAuth).set("n", "40"));
  EXPECT_EQ(s.store(kAuth).add("n", 2), 42);
}

TEST_F(RendezvousStateTest, StoreAddRejectsNonIntegerAndOverflow) {
  RendezvousState s(make_config(1, 1));
  ASSERT_NO_THROW(s.store(kAuth).set("text", "12abc"));
  auto r = refused([&] { s.store(kAuth).add("text", 1); });
  EXPECT_EQ(r.code, RpcCode::kInvalidArgument);
  EXPECT_THAT(r.message, HasSubstr("key 'text'"));
  ASSERT_NO_THROW(s.store(kAuth).set("big", "9223372036854775807"));
  auto o = refused([&] { s.store(kAuth).add("big", 1); });
  EXPECT_EQ(o.code, RpcCode::kInvalidArgument);
  EXPECT_THAT(o.message, HasSubstr("overflows"));
  EXPECT_EQ(s.store(kAuth).get("big"), "9223372036854775807");
}

TEST_F(RendezvousStateTest, StoreCompareSetFollowsTorchSemantics) {
  RendezvousState s(make_config(1, 1));
  auto missing = s.store(kAuth).compare_set("k", "x", "y");
  EXPECT_FALSE(missing.swapped);
  EXPECT_EQ(missing.current, "");
  EXPECT_FALSE(s.store(kAuth).get("k").has_value());
  auto create = s.store(kAuth).compare_set("k", "", "first");
  EXPECT_TRUE(create.swapped);
  EXPECT_EQ(create.current, "first");
  auto wrong = s.store(kAuth).compare_set("k", "nope", "second");
  EXPECT_FALSE(wrong.swapped);
  EXPECT_EQ(wrong.current, "first");
  auto right = s.store(kAuth).compare_set("k", "first", "second");
  EXPECT_TRUE(right.swapped);
  EXPECT_EQ(s.store(kAuth).get("k"), "second");
}

TEST_F(RendezvousStateTest, StoreRejectsEmptyAndOversizedKeys) {
  RendezvousConfig c = make_config(1, 1);
  c.limits.max_key_bytes = 8;
  RendezvousState s(c);
  EXPECT_EQ(refused([&] { s.store(kAuth).set("", "v"); }).code, RpcCode::kInvalidArgument);
  EXPECT_NO_THROW(s.store(kAuth).set("12345678", "v"));
  Refusal big = refused([&] { s.store(kAuth).set("123456789", "v"); });
  EXPECT_EQ(big.code, RpcCode::kInvalidArgument);
  EXPECT_EQ(big.message, "key '123456789' is 9 bytes, limit 8");
  EXPECT_EQ(refused([&] { s.store(kAuth).get("123456789"); }).code, RpcCode::kInvalidArgument);
  EXPECT_EQ(refused([&] { s.store(kAuth).add("123456789", 1); }).code, RpcCode::kInvalidArgument);
  EXPECT_EQ(refused([&] { s.store(kAuth).remove("123456789"); }).code, RpcCode::kInvalidArgument);
}

TEST_F(RendezvousStateTest, StoreKeyInMessagesIsShortenedAndEscaped) {
  RendezvousState s(make_config(1, 1));
  Refusal big = refused([&] { s.store(kAuth).set(std::string(5000, 'k'), "v"); });
  EXPECT_EQ(big.message, "key '" + std::string(40, 'k') + "...' is 5000 bytes, limit 4096");
  ASSERT_NO_THROW(s.store(kAuth).set(std::string("\x01z", 2), "abc"));
  EXPECT_THAT(refused([&] { s.store(kAuth).add(std::string("\x01z", 2), 1); }).message,
              HasSubstr("'\\x01z'"));
}

TEST_F(RendezvousStateTest, StoreRejectsOversizedValues) {
  RendezvousConfig c = make_config(1, 1);
  c.limits.max_value_bytes = 4;
  RendezvousState s(c);
  EXPECT_NO_THROW(s.store(kAuth).set("k", "1234"));
  Refusal big = refused([&] { s.store(kAuth).set("k", "12345"); });
  EXPECT_EQ(big.code, RpcCode::kInvalidArgument);
  EXPECT_EQ(big.message, "value of key 'k' is 5 bytes, limit 4");
  EXPECT_EQ(refused([&] { s.store(kAuth).compare_set("k", "1234", "12345"); }).code,
            RpcCode::kInvalidArgument);
  EXPECT_EQ(s.store(kAuth).get("k"), "1234");
}

TEST_F(RendezvousStateTest, StoreRejectsNewKeysBeyondTheLimitButUpdatesExisting) {
  RendezvousConfig c = make_config(1, 1);
  c.limits.max_keys = 2;
  RendezvousState s(c);
  ASSERT_NO_THROW(s.store(kAuth).set("a", "1"));
  ASSERT_NO_THROW(s.store(kAuth).set("b", "1"));
  Refusal full = refused([&] { s.store(kAuth).set("c", "1"); });
  EXPECT_EQ(full.code, RpcCode::kResourceExhausted);
  EXPECT_EQ(full.message,
            "cannot add key 'c': the store holds 2 keys, limit 2 (--rdzv_conf max_keys)");
  EXPECT_EQ(refused([&] { s.store(kAuth).add("c", 1); }).code, RpcCode::kResourceExhausted);
  EXPECT_EQ(refused([&] { s.store(kAuth).compare_set("c", "", "1"); }).code,
            RpcCode::kResourceExhausted);
  EXPECT_NO_THROW(s.store(kAuth).set("a", "2"));
  EXPECT_EQ(s.store(kAuth).add("b", 1), 2);
  EXPECT_EQ(s.store(kAuth).size(), 2);
}

TEST_F(RendezvousStateTest, VersionCountsStoreMutationsOnly) {
  RendezvousState s(make_config(1, 1));
  auto v = s.version();
  ASSERT_NO_THROW(s.store(kAuth).set("k", "1"));
  EXPECT_GT(s.version(), v);
  v = s.version();
  s.store(kAuth).get("k");
  s.store(kAuth).check({"k"});
  s.store(kAuth).size();
  s.store(kAuth).remove("missing");
  s.store(kAuth).compare_set("k", "wrong", "x");
  EXPECT_EQ(s.version(), v) << "reads and failed swaps change nothing";
  s.store(kAuth).add("k", 1);
  EXPECT_GT(s.version(), v);
  v = s.version();
  s.store(kAuth).remove("k");
  EXPECT_GT(s.version(), v);
}

// --- Barriers --------------------------------------------------------------------

TEST_F(RendezvousStateTest, BarrierCompletesWhenAllRanksArrive) {
  RendezvousState s(make_config(1, 1));
  auto t0 = arrive(s, "init", 0, 3);
  auto t2 = arrive(s, "init", 2, 3);
  EXPECT_FALSE(s.barriers(kAuth, now).passed(t0));
  advance(1s);
  auto t1 = arrive(s, "init", 1, 3);
  for (auto t : {t0, t1, t2}) {
    EXPECT_TRUE(s.barriers(kAuth, now).passed(t));
  }
  EXPECT_EQ(refused([&] { s.barriers(kAuth, now).passed(t0); }).code, RpcCode::kNotFound)
      << "answered tickets are consumed";
  EXPECT_FALSE(s.next_deadline().has_value());
}

TEST_F(RendezvousStateTest, BarrierOfOneCompletesAtOnce) {
  RendezvousState s(make_config(1, 1));
  auto t = arrive(s, "solo", 0, 1);
  EXPECT_TRUE(s.barriers(kAuth, now).passed(t));
}

TEST_F(RendezvousStateTest, BarrierTimeoutNamesMissingRanksAndArrivedHosts) {
  RendezvousState s(make_config(1, 1));
  auto t0 = arrive(s, "init", 0, 4, 2s);
  arrive(s, "init", 2, 4, 5s);
  advance(2s);
  auto r = refused([&] { s.barriers(kAuth, now).passed(t0); });
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
  EXPECT_FALSE(s.barriers(kAuth, now).passed(t2)) << "rank 0 no longer waits";
  advance(2s);
  auto r = refused([&] { s.barriers(kAuth, now).passed(t1); });
  EXPECT_EQ(r.code, RpcCode::kDeadlineExceeded);
  EXPECT_EQ(r.message,
            "barrier 'b' timed out after 5.0s: rank 0 arrived but timed out first "
            "(arrived: rank 1 on 'h1', rank 2 on 'h2')");
}

TEST_F(RendezvousStateTest, BarrierTimeoutSummarisesLargeWorlds) {
  RendezvousState s(make_config(1, 1));
  for (int rank = 0; rank < 1000; rank += 2) {
    ASSERT_NO_THROW(
        s.barriers(kAuth, now)
            .arrive("big", rank, 1 << 20, "node" + std::to_string(rank / 500), now + 1s, now));
  }
  auto t = arrive(s, "big", 1001, 1 << 20, 1s);
  advance(1s);
  auto r = refused([&] { s.barriers(kAuth, now).passed(t); });
  EXPECT_THAT(r.message, HasSubstr("ranks 1, 3, 5,"));
  EXPECT_THAT(r.message, HasSubstr("... (1048075 in all) never arrived"));
  EXPECT_THAT(r.message, HasSubstr("ranks 0, 2, 4,"));
  EXPECT_LT(r.message.size(), 1000u);
}

TEST_F(RendezvousStateTest, BarrierRejectsWorldSizeMismatch) {
  RendezvousState s(make_config(1, 1));
  arrive(s, "b", 0, 3);
  auto r = refused([&] { s.barriers(kAuth, now).arrive("b", 1, 4, "h", now + 1s, now); });
  EXPECT_EQ(r.code, RpcCode::kInvalidArgument);
  EXPECT_EQ(r.message, "barrier 'b': rank 1 gives world size 4, earlier ranks gave 3");
}

TEST_F(RendezvousStateTest, BarrierRejectsRankTwiceAndRankOutOfRange) {
  RendezvousState s(make_config(1, 1));
  arrive(s, "b", 1, 3);
  auto twice = refused([&] { s.barriers(kAuth, now).arrive("b", 1, 3, "again", now + 1s, now); });
  EXPECT_EQ(twice.code, RpcCode::kInvalidArgument);
  EXPECT_THAT(twice.message, HasSubstr("rank 1 arrived twice (first from host 'h1')"));
  EXPECT_EQ(refused([&] { s.barriers(kAuth, now).arrive("b", 3, 3, "h", now + 1s, now); }).code,
            RpcCode::kInvalidArgument);
  EXPECT_EQ(refused([&] { s.barriers(kAuth, now).arrive("b", -1, 3, "h", now + 1s, now); }).code,
            RpcCode::kInvalidArgument);
  EXPECT_EQ(refused([&] { s.barriers(kAuth, now).arrive("", 0, 3, "h", now + 1s, now); }).code,
            RpcCode::kInvalidArgument);
}

TEST_F(RendezvousStateTest, BarrierNameCanBeReused) {
  RendezvousState s(make_config(1, 1));
  for (int generation = 0; generation < 3; ++generation) {
    auto a = arrive(s, "step", 0, 2);
    auto b = arrive(s, "step", 1, 2);
    EXPECT_TRUE(s.barriers(kAuth, now).passed(a));
    EXPECT_TRUE(s.barriers(kAuth, now).passed(b));
  }
  auto next = arrive(s, "step", 0, 5);  // a new generation may even change size
  EXPECT_FALSE(s.barriers(kAuth, now).passed(next));
}

TEST_F(RendezvousStateTest, BarrierLimitsOpenBarriersAndWorldSize) {
  RendezvousConfig c = make_config(1, 1);
  c.limits.max_open_barriers = 2;
  c.limits.max_world_size = 8;
  RendezvousState s(c);
  arrive(s, "one", 0, 2);
  auto two = arrive(s, "two", 0, 2);
  auto r = refused([&] { s.barriers(kAuth, now).arrive("three", 0, 2, "h", now + 1s, now); });
  EXPECT_EQ(r.code, RpcCode::kResourceExhausted);
  EXPECT_THAT(r.message, HasSubstr("2 barriers are open, limit 2"));
  EXPECT_NO_THROW(s.barriers(kAuth, now).arrive("two", 1, 2, "h", now + 1s, now))
      << "joining an open one is fine";
  EXPECT_TRUE(s.barriers(kAuth, now).passed(two));
  EXPECT_NO_THROW(s.barriers(kAuth, now).arrive("three", 0, 2, "h", now + 1s, now)) << "room again";
  auto huge = refused([&] { s.barriers(kAuth, now).arrive("huge", 0, 9, "h", now + 1s, now); });
  EXPECT_EQ(huge.code, RpcCode::kInvalidArgument);
  EXPECT_THAT(huge.message, HasSubstr("world size 9 is outside [1, 8]"));
}

TEST_F(RendezvousStateTest, CancelledBarrierTicketWithdrawsItsRank) {
  RendezvousState s(make_config(1, 1));
  auto gone = arrive(s, "b", 0, 2);
  s.cancel(gone);
  EXPECT_FALSE(s.next_deadline().has_value());
  auto t1 = arrive(s, "b", 1, 2);
  EXPECT_FALSE(s.barriers(kAuth, now).passed(t1));
  auto t0 = arrive(s, "b", 0, 2);  // may arrive again: it was withdrawn
  EXPECT_TRUE(s.barriers(kAuth, now).passed(t0));
}

}  // namespace
}  // namespace rendezvous_test
}  // namespace ddp::launcher
