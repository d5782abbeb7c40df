// The rendezvous server over real gRPC: an in-process RendezvousServer on an
// ephemeral port, driven by real RendezvousClients (and by raw stubs where the
// client would hide what is tested: deadlines, cancellation). The store,
// barriers, joins and held heartbeats; rendezvous_service_limits_test.cc has
// connections, limits, auth, health, shutdown, IPv6 and TLS. Every wait is
// bounded; no test sleeps to make an ordering happen.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous_harness.h"
#include "subprocess.h"

namespace ddp::launcher {
namespace {

using namespace rendezvous_test;
using ::testing::HasSubstr;
using ::testing::Not;

// --- store --------------------------------------------------------------------------

TEST(RendezvousServiceTest, StoreRoundTripsEveryOperation) {
  Harness h;
  auto c = h.client();

  c->set("a/b/c", "v1");
  EXPECT_EQ(c->try_get("a/b/c"), "v1");
  c->set("a/b/c", "v2");  // overwrite
  EXPECT_EQ(c->try_get("a/b/c"), "v2");
  EXPECT_EQ(c->try_get("a/b"), std::nullopt);  // a prefix is not a key
  EXPECT_EQ(c->try_get("missing"), std::nullopt);

  const std::string binary("\0\x01\xff/x", 5);  // values are bytes
  c->set("/leading/slash/", binary);
  EXPECT_EQ(c->try_get("/leading/slash/"), binary);
  EXPECT_EQ(c->get("/leading/slash/", 1s), binary);  // present: no wait

  EXPECT_EQ(c->add("counter", 5), 5);  // missing counts as 0
  EXPECT_EQ(c->add("counter", -7), -2);
  EXPECT_EQ(c->try_get("counter"), "-2");

  auto cas = c->compare_set("cas/key", "", "first");  // missing + empty expected: set
  EXPECT_TRUE(cas.swapped);
  EXPECT_EQ(cas.current, "first");
  cas = c->compare_set("cas/key", "wrong", "second");
  EXPECT_FALSE(cas.swapped);
  EXPECT_EQ(cas.current, "first");
  cas = c->compare_set("cas/key", "first", "second");
  EXPECT_TRUE(cas.swapped);
  EXPECT_EQ(cas.current, "second");

  c->wait({"a/b/c", "counter"}, 1s);  // all present: returns at once
  c->wait({}, 1s);

  EXPECT_EQ(c->num_keys(), 4);
  EXPECT_TRUE(c->remove("a/b/c"));
  EXPECT_FALSE(c->remove("a/b/c"));
  EXPECT_EQ(c->try_get("a/b/c"), std::nullopt);
  EXPECT_EQ(c->num_keys(), 3);

  // Another client (another connection) sees the same store.
  EXPECT_EQ(h.client()->try_get("cas/key"), "second");
}

TEST(RendezvousServiceTest, GetWithWaitReturnsAKeySetLaterByAnotherClient) {
  Harness h;
  auto getter = h.client();
  auto setter = h.client();
  std::promise<void> calling;
  auto got = std::async(std::launch::async, [&] {
    calling.set_value();
    return getter->get("later/key", 10s);
  });
  calling.get_future().wait();
  // Not there yet: the get keeps waiting (a bounded negative check; it cannot
  // fail spuriously when the server is right).
  EXPECT_EQ(got.wait_for(50ms), std::future_status::timeout);
  setter->set("later/key", "value");
  ASSERT_EQ(got.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(got.get(), "value");
}

TEST(RendezvousServiceTest, GetWithWaitIsWokenByAddAndCompareSetToo) {
  Harness h;
  auto writer = h.client();
  auto added = std::async(std::launch::async, [&] { return h.client()->get("by/add", 10s); });
  auto swapped = std::async(std::launch::async, [&] { return h.client()->get("by/cas", 10s); });
  EXPECT_EQ(added.wait_for(50ms), std::future_status::timeout);
  writer->set("unrelated", "x");  // wakes no one
  EXPECT_EQ(added.wait_for(20ms), std::future_status::timeout);
  EXPECT_EQ(writer->add("by/add", 7), 7);
  EXPECT_TRUE(writer->compare_set("by/cas", "", "new").swapped);
  ASSERT_EQ(added.wait_for(5s), std::future_status::ready);
  ASSERT_EQ(swapped.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(added.get(), "7");
  EXPECT_EQ(swapped.get(), "new");
}

TEST(RendezvousServiceTest, WaitForKeysReturnsOnceEveryKeyIsSet) {
  Harness h;
  auto waiter = h.client();
  auto setter = h.client();
  std::promise<void> calling;
  auto done = std::async(std::launch::async, [&] {
    calling.set_value();
    waiter->wait({"w/1", "w/2"}, 10s);
  });
  calling.get_future().wait();
  setter->set("w/1", "x");
  EXPECT_EQ(done.wait_for(50ms), std::future_status::timeout) << "returned with w/2 missing";
  setter->set("w/2", "y");
  ASSERT_EQ(done.wait_for(5s), std::future_status::ready);
  done.get();

  // A key named twice is waited for once.
  auto twice = std::async(std::launch::async, [&] { waiter->wait({"w/3", "w/3"}, 10s); });
  EXPECT_EQ(twice.wait_for(20ms), std::future_status::timeout);
  setter->set("w/3", "z");
  ASSERT_EQ(twice.wait_for(5s), std::future_status::ready);
  twice.get();
}

TEST(RendezvousServiceTest, GetWithWaitTimesOutWithDeadlineExceededNamingTheKey) {
  Harness h;
  auto c = h.client();
  const auto start = Clock::now();
  auto err = rpc_error_of([&] { c->get("never/set/key", 300ms); });
  const double took = ms_since(start);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->code(), code(RpcCode::kDeadlineExceeded)) << err->what();
  EXPECT_THAT(err->what(), HasSubstr("never/set/key"));
  EXPECT_GE(took, 280);
  EXPECT_LT(took, 2000) << "the server answers at the key's own timeout";
}

TEST(RendezvousServiceTest, WaitForKeysTimesOutNamingOnlyTheMissingKeys) {
  Harness h;
  auto c = h.client();
  c->set("present", "1");
  auto err = rpc_error_of([&] { c->wait({"present", "absent/key"}, 200ms); });
  ASSERT_TRUE(err);
  EXPECT_EQ(err->code(), code(RpcCode::kDeadlineExceeded)) << err->what();
  EXPECT_THAT(err->what(), HasSubstr("'absent/key'"));
  EXPECT_THAT(err->what(), Not(HasSubstr("'present'")));
}

// --- barriers -----------------------------------------------------------------------

// The ranks of "...: ranks 0, 2-3 never arrived (...)".
std::set<int> missing_ranks(const std::string& message) {
  std::set<int> ranks;
  const auto end = message.find(" never arrived");
  if (end == std::string::npos) return ranks;
  auto begin = message.rfind("rank", end);
  if (begin == std::string::npos) return ranks;
  begin = message.find(' ', begin) + 1;
  std::istringstream list(message.substr(begin, end - begin));
  std::string item;
  while (std::getline(list, item, ',')) {
    const int first = std::stoi(item);
    const auto dash = item.find('-');
    const int last = dash == std::string::npos ? first : std::stoi(item.substr(dash + 1));
    for (int r = first; r <= last; ++r) ranks.insert(r);
  }
  return ranks;
}

class BarrierSizes : public ::testing::TestWithParam<int> {};

TEST_P(BarrierSizes, BarrierPassesWhenEveryRankArrives) {
  const int world = GetParam();
  Harness h;
  std::vector<std::unique_ptr<RendezvousClient>> clients;
  for (int r = 0; r < world; ++r) clients.push_back(h.client());
  std::atomic<int> passed{0};
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        for (int gen = 0; gen < 3; ++gen) {  // the same name again: a new generation
          clients[r]->barrier("step", r, world, 10s, "host-" + std::to_string(r));
          passed.fetch_add(1);
        }
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  EXPECT_EQ(passed.load(), 3 * world);
}

INSTANTIATE_TEST_SUITE_P(Ranks, BarrierSizes, ::testing::Values(2, 4, 8));

TEST(RendezvousServiceTest, BarrierWithAMissingRankFailsListingItWithinItsTimeout) {
  Harness h;
  const int world = 4;
  const std::vector<int> present = {0, 1, 3};  // rank 2 never arrives
  std::vector<std::optional<RpcError>> errors(world);
  std::vector<double> took(world);
  std::vector<std::thread> threads;
  for (int r : present) {
    threads.emplace_back([&, r] {
      auto c = h.client();
      const auto start = Clock::now();
      errors[r] = rpc_error_of([&] { c->barrier("init", r, world, 400ms, "host-a"); });
      took[r] = ms_since(start);
    });
  }
  for (auto& t : threads) t.join();
  // Each rank's timeout runs from its own arrival, and a rank that times out
  // is withdrawn, so ranks that time out later also count the earlier ones as
  // missing. The first to time out names exactly rank 2; every one names it.
  bool exactly_rank2 = false;
  for (int r : present) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " passed a barrier missing rank 2";
    EXPECT_EQ(errors[r]->code(), code(RpcCode::kDeadlineExceeded)) << errors[r]->what();
    EXPECT_THAT(errors[r]->what(), HasSubstr("'init'"));
    const std::set<int> missing = missing_ranks(errors[r]->what());
    EXPECT_TRUE(missing.count(2)) << errors[r]->what();
    exactly_rank2 |= missing == std::set<int>{2};
    EXPECT_GE(took[r], 350) << "rank " << r;
    EXPECT_LT(took[r], 2500) << "rank " << r;
  }
  EXPECT_TRUE(exactly_rank2) << "no rank reported 'rank 2 never arrived'";
}

TEST(RendezvousServiceTest, CancelledBarrierWaiterDoesNotLeaveItsRankCounted) {
  Harness h;
  auto stub = h.stub();
  v1::BarrierRequest req;
  *req.mutable_auth() = good_auth();
  req.set_name("cancel/me");
  req.set_rank(0);
  req.set_world_size(2);
  req.set_timeout_ms(30000);  // the server would wait long; the client gives up first
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 300ms);
    v1::BarrierResponse resp;
    grpc::Status s = stub->Barrier(&ctx, req, &resp);
    ASSERT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  }
  // The cancellation reaches the server asynchronously. Rank 0 arriving again
  // is refused ("arrived twice") while the cancelled arrival still counts, and
  // accepted once it is withdrawn: then, alone, it times out missing rank 1.
  auto c = h.client();
  std::string last;
  const bool withdrawn = ddp::testing::wait_until(
      [&] {
        auto err = rpc_error_of([&] { c->barrier("cancel/me", 0, 2, 100ms); });
        last = err ? err->what() : "passed";
        return err && err->code() == code(RpcCode::kDeadlineExceeded);
      },
      5s);
  ASSERT_TRUE(withdrawn) << last;
  EXPECT_THAT(last, HasSubstr("rank 1 never arrived"));

  // Ranks 0 and 1 now pass together.
  auto c1 = h.client();
  auto rank1 = std::async(std::launch::async, [&] { c1->barrier("cancel/me", 1, 2, 10s); });
  c->barrier("cancel/me", 0, 2, 10s);
  rank1.get();
}

TEST(RendezvousServiceTest, ClientTryCancelWithdrawsAWaitingBarrierRank) {
  Harness h;
  auto stub = h.stub();
  v1::BarrierRequest req;
  *req.mutable_auth() = good_auth();
  req.set_name("trycancel");
  req.set_rank(1);
  req.set_world_size(2);
  req.set_timeout_ms(30000);
  grpc::ClientContext ctx;
  v1::BarrierResponse resp;
  std::promise<grpc::Status> finished;
  stub->async()->Barrier(&ctx, &req, &resp, [&](grpc::Status s) { finished.set_value(s); });
  auto status = finished.get_future();

  // Nothing observable tells that the server holds the call without changing
  // the barrier, so give it time to arrive; arriving late would only make the
  // test vacuous, never make it fail.
  EXPECT_EQ(status.wait_for(100ms), std::future_status::timeout);
  ctx.TryCancel();
  ASSERT_EQ(status.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(status.get().error_code(), grpc::StatusCode::CANCELLED);

  // Once the server has seen the cancellation, rank 1 is free again ("arrived
  // twice" until then), and rank 0 alone must not complete with the cancelled
  // rank 1.
  auto c = h.client();
  std::string last;
  ASSERT_TRUE(ddp::testing::wait_until(
      [&] {
        auto err = rpc_error_of([&] { c->barrier("trycancel", 1, 2, 100ms); });
        last = err ? err->what() : "passed";
        return err && err->code() == code(RpcCode::kDeadlineExceeded);
      },
      5s))
      << last;
  auto err = rpc_error_of([&] { c->barrier("trycancel", 0, 2, 200ms); });
  ASSERT_TRUE(err) << "rank 0 passed with only a cancelled rank 1";
  EXPECT_THAT(err->what(), HasSubstr("rank 1 never arrived"));
}

// --- membership ---------------------------------------------------------------------

TEST(RendezvousServiceTest, JoinOfTwoNodesAssignsRanksOffsetsAndGroupRankZerosMaster) {
  Harness h(make_config(2, 2));
  NodeInfo b{-1, 3, "node-b", "10.0.0.2", 29502};
  NodeInfo a{-1, 2, "node-a", "10.0.0.1", 29501};
  auto cb = h.client();
  auto ca = h.client();
  auto jb = std::async(std::launch::async, [&] { return cb->join(b, 10s); });
  auto ja = std::async(std::launch::async, [&] { return ca->join(a, 10s); });
  ASSERT_EQ(ja.wait_for(8s), std::future_status::ready);
  ASSERT_EQ(jb.wait_for(8s), std::future_status::ready);
  RoundAssignment ra = ja.get(), rb = jb.get();

  // Automatic ranks follow host names, whoever joined first.
  EXPECT_EQ(ra.group_rank, 0);
  EXPECT_EQ(rb.group_rank, 1);
  EXPECT_EQ(ra.global_rank_offset, 0);
  EXPECT_EQ(rb.global_rank_offset, 2);
  for (const RoundAssignment& r : {ra, rb}) {
    EXPECT_EQ(r.round, 1);
    EXPECT_EQ(r.group_world_size, 2);
    EXPECT_EQ(r.world_size, 5);
    EXPECT_EQ(r.master_addr, "10.0.0.1");
    EXPECT_EQ(r.master_port, 29501);
    EXPECT_EQ(r.restart_count, 0);
  }
  EXPECT_EQ(h.server.service().phase(), RendezvousState::Phase::kRunning);

  // The round runs: heartbeats answer "not ended"; a third node is told to wait.
  EXPECT_FALSE(ca->heartbeat(1, 0, 5s).round_ended);
  auto err = rpc_error_of([&] { h.client()->join({-1, 1, "node-c", "10.0.0.3", 0}, 5s); });
  ASSERT_TRUE(err);
  EXPECT_EQ(err->code(), code(RpcCode::kUnavailable)) << err->what();
  EXPECT_NE(std::string(err->what()).find("round 1 is full"), std::string::npos) << err->what();
}

TEST(RendezvousServiceTest, AHeldHeartbeatIsAnsweredWhenAnotherNodeFails) {
  Harness h(make_config(2, 2));
  auto a = h.client(), b = h.client();
  auto [ra, rb] = form_two(*a, *b);
  // Not ended: the server holds the answer for the hold, then says "runs".
  auto start = Clock::now();
  EXPECT_FALSE(a->heartbeat(ra.round, ra.group_rank, 5s, 300ms).round_ended);
  EXPECT_GE(ms_since(start), 250) << "the server did not hold the heartbeat";
  // A failure elsewhere answers a held heartbeat at once, not after its 20 s hold.
  auto held = std::async(std::launch::async,
                         [&, ra = ra] { return a->heartbeat(ra.round, ra.group_rank, 5s, 20s); });
  ASSERT_EQ(held.wait_for(200ms), std::future_status::timeout) << "answered before the round ended";
  start = Clock::now();
  b->report_failure(rb.round, rb.group_rank, "node-b: rank 1 exited with code 3", 3);
  ASSERT_EQ(held.wait_for(10s), std::future_status::ready);
  RoundStatus end = held.get();
  EXPECT_LT(ms_since(start), 10000);
  EXPECT_TRUE(end.round_ended);
  EXPECT_FALSE(end.succeeded);
  EXPECT_THAT(end.reason, HasSubstr("rank 1 exited with code 3"));
  EXPECT_FALSE(h.server.service().outcome_delivered()) << "node a has not acknowledged";
  a->acknowledge_end(ra.round, ra.group_rank, 5s);
  EXPECT_TRUE(h.server.service().outcome_delivered()) << "node b reported the failure itself";
}

TEST(RendezvousServiceTest, AHeldHeartbeatHearsTheJobSucceedAndCanBeCancelled) {
  Harness h(make_config(2, 2));
  auto a = h.client(), b = h.client();
  auto [ra, rb] = form_two(*a, *b);
  CallCanceller canceller;
  auto cancelled = std::async(std::launch::async, [&, ra = ra] {
    return rpc_error_of([&] { a->heartbeat(ra.round, ra.group_rank, 5s, 20s, &canceller); });
  });
  ASSERT_EQ(cancelled.wait_for(200ms), std::future_status::timeout);
  canceller.cancel();
  ASSERT_EQ(cancelled.wait_for(10s), std::future_status::ready);
  auto err = cancelled.get();
  ASSERT_TRUE(err);
  EXPECT_EQ(err->code(), code(RpcCode::kCancelled)) << err->what();

  auto held = std::async(std::launch::async,
                         [&, ra = ra] { return a->heartbeat(ra.round, ra.group_rank, 5s, 20s); });
  a->leave(ra.round, ra.group_rank, 0);
  ASSERT_EQ(held.wait_for(200ms), std::future_status::timeout) << "answered before every node left";
  EXPECT_FALSE(h.server.service().outcome_delivered());
  b->leave(rb.round, rb.group_rank, 0);
  ASSERT_EQ(held.wait_for(10s), std::future_status::ready);
  EXPECT_TRUE(held.get().succeeded);
  a->acknowledge_end(ra.round, ra.group_rank, 5s);
  EXPECT_FALSE(h.server.service().outcome_delivered()) << "node b has not heard yet";
  EXPECT_TRUE(b->heartbeat(rb.round, rb.group_rank, 5s).succeeded);
  EXPECT_FALSE(h.server.service().outcome_delivered()) << "an answer is not an acknowledgement";
  b->acknowledge_end(rb.round, rb.group_rank, 5s);
  EXPECT_TRUE(h.server.service().outcome_delivered());
}

}  // namespace
}  // namespace ddp::launcher
