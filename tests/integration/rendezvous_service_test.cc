// The rendezvous server over real gRPC: an in-process RendezvousServer on an
// ephemeral port, driven by real RendezvousClients (and by raw stubs where the
// client would hide what is tested: deadlines, cancellation, the health
// service). Every wait is bounded; no test sleeps to make an ordering happen.
// Over 600 lines because it covers every RPC of the service over one harness.

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddp/common/rendezvous_client.h"
#include "ddp/v1/rendezvous.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "rpc/rendezvous_service.h"
#include "subprocess.h"
#include "test_pki.h"

namespace ddp::launcher {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;

constexpr char kRunId[] = "run-it";
constexpr char kToken[] = "token-it";

RendezvousConfig make_config(int min_nodes = 1, int max_nodes = 1) {
  RendezvousConfig c;
  c.run_id = kRunId;
  c.token = kToken;
  c.min_nodes = min_nodes;
  c.max_nodes = max_nodes;
  c.join_timeout = 20s;
  c.last_call_timeout = 0ms;
  return c;
}

// One server and the clients that talk to it.
struct Harness {
  explicit Harness(const RendezvousConfig& config = make_config(),
                   const ServerOptions& options = {})
      : server(config, options), endpoint(host_of(options) + ":" + std::to_string(server.port())) {}

  static std::string host_of(const ServerOptions& o) {
    return o.host.find(':') != std::string::npos ? "[" + o.host + "]" : o.host;
  }
  std::unique_ptr<RendezvousClient> client(const std::string& token = kToken,
                                           const std::string& run_id = kRunId) const {
    return std::make_unique<RendezvousClient>(endpoint, run_id, token);
  }
  std::unique_ptr<v1::Rendezvous::Stub> stub() const {
    return v1::Rendezvous::NewStub(
        grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials()));
  }

  RendezvousServer server;
  std::string endpoint;
};

// The RpcError `f` throws, or nullopt when it returns normally.
template <class F>
std::optional<RpcError> rpc_error_of(F&& f) {
  try {
    f();
  } catch (const RpcError& e) {
    return e;
  }
  return std::nullopt;
}

int code(RpcCode c) { return static_cast<int>(c); }

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

v1::Auth good_auth() {
  v1::Auth a;
  a.set_run_id(kRunId);
  a.set_token(kToken);
  return a;
}

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

// Two nodes joined into one round of make_config(2, 2).
std::pair<RoundAssignment, RoundAssignment> form_two(RendezvousClient& a, RendezvousClient& b) {
  auto ja = std::async(std::launch::async, [&] {
    return a.join({0, 1, "node-a", "10.0.0.1", 29501}, 10s);
  });
  auto jb = std::async(std::launch::async, [&] {
    return b.join({1, 1, "node-b", "10.0.0.2", 0}, 10s);
  });
  return {ja.get(), jb.get()};
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

// A plain TCP connection to the server's port on loopback, reads timing out after 5 s.
int connect_to(int port) {
  int fd = ddp::testing::connect_loopback(port);
  EXPECT_GE(fd, 0);
  timeval five{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &five, sizeof five);
  return fd;
}

// Reads until the server closes the connection (an orderly close, or a reset
// when it closed with our bytes unread); false when 5 s pass first.
bool read_until_closed(int fd) {
  char buf[256];
  ssize_t n = 0;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) {
  }
  const bool closed = n == 0 || errno == ECONNRESET;
  close(fd);
  return closed;
}

TEST(RendezvousServiceTest, AConnectionThatNeverSpeaksGrpcIsClosed) {
  ServerOptions options;
  options.handshake_timeout_ms = 300;
  Harness h(make_config(), options);
  int fd = connect_to(h.server.port());
  const auto start = Clock::now();
  EXPECT_TRUE(read_until_closed(fd)) << "not closed within 5 s";
  EXPECT_LT(ms_since(start), 4000);
  // The server still serves.
  h.client()->set("after", "ok");
  EXPECT_EQ(h.client()->get("after", 1s), "ok");
}

TEST(RendezvousServiceTest, AConnectionThatSpeaksSomethingElseIsClosedAtOnce) {
  Harness h;  // the default 10 s handshake timeout: the close must not wait for it
  for (const std::string& junk :
       {std::string("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), std::string("PRI * HTTP/1.1\r\n")}) {
    int fd = connect_to(h.server.port());
    ASSERT_EQ(send(fd, junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
    const auto start = Clock::now();
    EXPECT_TRUE(read_until_closed(fd)) << junk;
    EXPECT_LT(ms_since(start), 2000) << junk;
  }
  h.client()->set("after", "ok");
  EXPECT_EQ(h.client()->get("after", 1s), "ok");
}

TEST(RendezvousServiceTest, WaitingRequestsAreBoundedAndTheLimitIsNamed) {
  RendezvousConfig config = make_config();
  config.limits.max_pending_waits = 2;
  Harness h(config);
  auto a = h.client(), b = h.client(), c = h.client();
  auto wa = std::async(std::launch::async, [&] { return a->get("later", 10s); });
  auto wb = std::async(std::launch::async, [&] { return b->get("later", 10s); });
  ASSERT_TRUE(
      ddp::testing::wait_until([&] { return h.server.service().pending_waits() == 2; }, 10s));
  auto err = rpc_error_of([&] { c->get("later", 10s); });
  ASSERT_TRUE(err);
  EXPECT_EQ(err->code(), code(RpcCode::kResourceExhausted)) << err->what();
  EXPECT_THAT(err->what(),
              HasSubstr("holds 2 waiting requests, its limit (--rdzv_conf max_pending_waits)"));
  c->set("now", "1");
  EXPECT_EQ(c->get("now", 1s), "1") << "a get that is answered at once needs no room";
  // A node's heartbeat is never refused: at the limit it is answered at once.
  auto n1 = h.client();
  RoundAssignment round = n1->join({-1, 1, "node-a", "10.0.0.1", 29501}, 10s);
  const auto start = Clock::now();
  EXPECT_FALSE(n1->heartbeat(round.round, round.group_rank, 5s, 3s).round_ended);
  EXPECT_LT(ms_since(start), 2000) << "held although the server was at its limit";
  c->set("later", "v");
  EXPECT_EQ(wa.get(), "v");
  EXPECT_EQ(wb.get(), "v");
}

TEST(RendezvousServiceTest, LongErrorsKeepTheirHeadInsteadOfBecomingAMetadataError) {
  Harness h(make_config(2, 2));
  auto a = h.client(), b = h.client();
  // A Wait on 2000 keys that times out names them: 90 KB of text.
  std::vector<std::string> keys;
  for (int i = 0; i < 2000; ++i)
    keys.push_back("a/rather/long/key/name/number/" + std::to_string(i));
  auto err = rpc_error_of([&] { a->wait(keys, 200ms); });
  ASSERT_TRUE(err);
  EXPECT_EQ(err->code(), code(RpcCode::kDeadlineExceeded))
      << std::string(err->what()).substr(0, 300);
  EXPECT_THAT(err->what(), HasSubstr("keys never set within"));
  EXPECT_THAT(err->what(), HasSubstr("more bytes cut)"));
  // A join after a job whose failure report is 27 KB hears the head of it.
  auto [ra, rb] = form_two(*a, *b);
  std::string report = "node-b: rank 3 exited with code 1\n";
  while (report.size() < 27000) report += "a line of the rank's stderr, quoted in the report\n";
  b->report_failure(rb.round, rb.group_rank, report, 1);
  err = rpc_error_of([&] { h.client()->join({-1, 1, "node-c", "10.0.0.3", 0}, 5s); });
  ASSERT_TRUE(err);
  EXPECT_EQ(err->code(), code(RpcCode::kFailedPrecondition))
      << std::string(err->what()).substr(0, 300);
  EXPECT_THAT(err->what(), HasSubstr("failed with no restarts left"));
  EXPECT_THAT(err->what(), HasSubstr("rank 3 exited with code 1"));
  EXPECT_THAT(err->what(), HasSubstr("more bytes cut)"));
}

TEST(RendezvousServiceTest, ElasticJoinClosesAtTheLastCallWithTheNodesPresent) {
  RendezvousConfig config = make_config(1, 3);
  config.last_call_timeout = 300ms;
  Harness h(config);
  auto c = h.client();
  const auto start = Clock::now();
  RoundAssignment a = c->join({-1, 4, "only-node", "10.0.0.9", 29400}, 10s);
  const double took = ms_since(start);
  EXPECT_EQ(a.group_world_size, 1);
  EXPECT_EQ(a.world_size, 4);
  EXPECT_EQ(a.master_addr, "10.0.0.9");
  EXPECT_GE(took, 280) << "closed before the last call";
  EXPECT_LT(took, 2000) << "the timer closes the round at the last call";
}

// --- authentication -----------------------------------------------------------------

TEST(RendezvousServiceTest, WrongTokenIsUnauthenticatedAndChangesNothing) {
  Harness h(make_config(1, 1));
  auto bad = h.client("not-the-token");
  auto good = h.client();

  auto err = rpc_error_of([&] { bad->set("secret/key", "v"); });
  ASSERT_TRUE(err);
  EXPECT_EQ(err->code(), code(RpcCode::kUnauthenticated)) << err->what();
  EXPECT_THAT(err->what(), HasSubstr("Set 'secret/key'"));
  EXPECT_EQ(good->try_get("secret/key"), std::nullopt);
  EXPECT_EQ(good->num_keys(), 0);

  good->set("k", "v");
  for (auto& op : std::vector<std::function<void()>>{
           [&] { bad->try_get("k"); },
           [&] { bad->get("k", 1s); },
           [&] { bad->remove("k"); },
           [&] { bad->add("n", 1); },
           [&] { bad->compare_set("k", "v", "w"); },
           [&] { bad->wait({"k"}, 1s); },
           [&] { bad->num_keys(); },
           [&] { bad->barrier("b", 0, 1, 1s); },
           [&] {
             bad->join({-1, 1, "h", "a", 0}, 2s);
           },
       }) {
    auto e = rpc_error_of(op);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->code(), code(RpcCode::kUnauthenticated)) << e->what();
  }
  // Nothing changed: no key removed or added, no round formed (a one-node
  // barrier or join with the token would have passed at once).
  EXPECT_EQ(good->try_get("k"), "v");
  EXPECT_EQ(good->num_keys(), 1);
  EXPECT_EQ(h.server.service().phase(), RendezvousState::Phase::kForming);
}

TEST(RendezvousServiceTest, WrongRunIdIsInvalidArgument) {
  Harness h;
  auto other = h.client(kToken, "some-other-run");
  auto err = rpc_error_of([&] { other->set("k", "v"); });
  ASSERT_TRUE(err);
  EXPECT_EQ(err->code(), code(RpcCode::kInvalidArgument)) << err->what();
  EXPECT_THAT(err->what(), HasSubstr("some-other-run"));
  EXPECT_EQ(h.client()->num_keys(), 0);
}

// --- limits -------------------------------------------------------------------------

TEST(RendezvousServiceTest, OversizeKeyIsInvalidArgument) {
  Harness h;
  auto c = h.client();
  const std::string key(RendezvousLimits{}.max_key_bytes + 1, 'k');
  auto err = rpc_error_of([&] { c->set(key, "v"); });
  ASSERT_TRUE(err);
  EXPECT_EQ(err->code(), code(RpcCode::kInvalidArgument)) << err->what();
  EXPECT_EQ(c->num_keys(), 0);
}

TEST(RendezvousServiceTest, OversizeValueIsInvalidArgument) {
  RendezvousConfig config = make_config();
  config.limits.max_value_bytes = 1024;
  Harness h(config);
  auto c = h.client();
  c->set("fits", std::string(1024, 'v'));
  auto err = rpc_error_of([&] { c->set("too/big", std::string(1025, 'v')); });
  ASSERT_TRUE(err);
  EXPECT_EQ(err->code(), code(RpcCode::kInvalidArgument)) << err->what();
  EXPECT_THAT(err->what(), HasSubstr("too/big"));
  EXPECT_EQ(c->try_get("too/big"), std::nullopt);
}

TEST(RendezvousServiceTest, TooManyKeysIsResourceExhausted) {
  RendezvousConfig config = make_config();
  config.limits.max_keys = 3;
  Harness h(config);
  auto c = h.client();
  c->set("k1", "v");
  c->set("k2", "v");
  c->add("k3", 1);
  auto err = rpc_error_of([&] { c->set("k4", "v"); });
  ASSERT_TRUE(err);
  EXPECT_EQ(err->code(), code(RpcCode::kResourceExhausted)) << err->what();
  c->set("k1", "overwrite");  // existing keys may still change
  EXPECT_EQ(c->num_keys(), 3);
}

TEST(RendezvousServiceTest, MessageOverTheGrpcLimitIsResourceExhaustedAndTheServerKeepsServing) {
  ServerOptions options;
  options.max_message_bytes = 64 << 10;
  Harness h(make_config(), options);
  auto c = h.client();
  auto err = rpc_error_of([&] { c->set("huge", std::string(256 << 10, 'x')); });
  ASSERT_TRUE(err);
  EXPECT_EQ(err->code(), code(RpcCode::kResourceExhausted)) << err->what();
  c->set("small", "ok");
  EXPECT_EQ(c->try_get("small"), "ok");
  EXPECT_EQ(c->try_get("huge"), std::nullopt);
}

// --- health -------------------------------------------------------------------------

grpc::health::v1::HealthCheckResponse::ServingStatus check_health(
    grpc::health::v1::Health::Stub& stub, grpc::Status* status) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 3s);
  grpc::health::v1::HealthCheckRequest req;
  req.set_service("");
  grpc::health::v1::HealthCheckResponse resp;
  *status = stub.Check(&ctx, req, &resp);
  return resp.status();
}

TEST(RendezvousServiceTest, HealthIsServingWhileUpAndUnavailableAfterShutdown) {
  Harness h;
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(h.endpoint, grpc::InsecureChannelCredentials()));
  grpc::Status status;
  EXPECT_EQ(check_health(*stub, &status), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_TRUE(status.ok()) << status.error_message();

  const auto start = Clock::now();
  h.server.shutdown();
  EXPECT_LT(ms_since(start), 2500);
  check_health(*stub, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

TEST(RendezvousServiceTest, HealthWatchReportsNotServingWhenShutdownBegins) {
  Harness h;
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(h.endpoint, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  grpc::health::v1::HealthCheckRequest req;
  auto reader = stub->Watch(&ctx, req);
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  std::thread stopper([&] { h.server.shutdown(); });
  // The status flips before the server stops, and a watcher is told.
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  ctx.TryCancel();
  reader->Finish();
  stopper.join();
}

TEST(RendezvousServiceTest, ShutdownReleasesWaitersWithUnavailable) {
  Harness h;
  // A raw, fail-fast stub: whether the get is already waiting (released by the
  // server) or arrives once the server is gone (refused by the transport), it
  // ends promptly with UNAVAILABLE.
  auto stub = h.stub();
  auto got = std::async(std::launch::async, [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 20s);
    v1::GetRequest req;
    *req.mutable_auth() = good_auth();
    req.set_key("never");
    req.set_wait(true);
    req.set_timeout_ms(15000);
    v1::GetResponse resp;
    return stub->Get(&ctx, req, &resp);
  });
  EXPECT_EQ(got.wait_for(50ms), std::future_status::timeout);
  h.server.shutdown();
  ASSERT_EQ(got.wait_for(5s), std::future_status::ready);
  grpc::Status status = got.get();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

// --- transports ---------------------------------------------------------------------

bool can_bind_ipv6_loopback() {
  int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_loopback;
  addr.sin6_port = 0;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

TEST(RendezvousServiceTest, ServesOverIpv6Loopback) {
  if (!can_bind_ipv6_loopback())
    GTEST_SKIP() << "cannot bind [::1] on this machine (no IPv6 loopback)";
  ServerOptions options;
  options.host = "::1";
  Harness h(make_config(), options);
  ASSERT_EQ(h.endpoint, "[::1]:" + std::to_string(h.server.port()));
  auto c = h.client();
  c->set("v6", "yes");
  EXPECT_EQ(c->try_get("v6"), "yes");
  c->barrier("v6/b", 0, 1, 2s);
}

// A server with the test PKI's certificate and key.
ServerOptions tls_server_options(const ddp::testing::TestPki& pki) {
  ServerOptions options;
  options.tls_cert = pki.cert;
  options.tls_key = pki.key;
  return options;
}

TEST(RendezvousServiceTest, TlsClientTrustingTheCaIsServed) {
  const ddp::testing::TestPki& pki = ddp::testing::test_pki();
  if (!pki.error.empty()) GTEST_SKIP() << pki.error;
  Harness h(make_config(), tls_server_options(pki));
  const std::string port = std::to_string(h.server.port());
  for (const std::string host : {"localhost", "127.0.0.1"}) {
    RendezvousClient c(host + ":" + port, kRunId, kToken, TlsFiles{"", "", pki.ca});
    c.set("tls/" + host, "secure");
    EXPECT_EQ(c.try_get("tls/" + host), "secure");
  }
}

// Raw stubs: RendezvousClient waits for a server it cannot reach (yet) until
// its deadline; a fail-fast call shows what the server does with the attempt.
grpc::Status set_with(const std::shared_ptr<grpc::ChannelCredentials>& creds,
                      const std::string& endpoint) {
  auto stub = v1::Rendezvous::NewStub(grpc::CreateChannel(endpoint, creds));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 5s);
  v1::SetRequest req;
  *req.mutable_auth() = good_auth();
  req.set_key("k");
  req.set_value("v");
  v1::SetResponse resp;
  return stub->Set(&ctx, req, &resp);
}

TEST(RendezvousServiceTest, InsecureOrUntrustingClientAgainstTlsServerIsUnavailable) {
  const ddp::testing::TestPki& pki = ddp::testing::test_pki();
  if (!pki.error.empty()) GTEST_SKIP() << pki.error;
  Harness h(make_config(), tls_server_options(pki));
  const std::string port = std::to_string(h.server.port());

  grpc::Status plain = set_with(grpc::InsecureChannelCredentials(), "127.0.0.1:" + port);
  EXPECT_EQ(plain.error_code(), grpc::StatusCode::UNAVAILABLE) << plain.error_message();

  grpc::SslCredentialsOptions other;
  other.pem_root_certs = ddp::testing::read_file(pki.other_ca);
  grpc::Status untrusting = set_with(grpc::SslCredentials(other), "localhost:" + port);
  EXPECT_EQ(untrusting.error_code(), grpc::StatusCode::UNAVAILABLE) << untrusting.error_message();

  RendezvousClient trusting("localhost:" + port, kRunId, kToken, TlsFiles{"", "", pki.ca});
  EXPECT_EQ(trusting.try_get("k"), std::nullopt) << "a refused client stored a key";
}

}  // namespace
}  // namespace ddp::launcher
