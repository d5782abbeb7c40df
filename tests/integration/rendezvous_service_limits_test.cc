// The rendezvous server over real gRPC, at its edges: connections that never
// speak gRPC, bounded waiting requests, limits on keys and messages, auth,
// the standard health service, shutdown, IPv6 loopback and TLS. Every wait is
// bounded; no test sleeps to make an ordering happen.

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "rendezvous_harness.h"
#include "subprocess.h"
#include "test_pki.h"

namespace ddp::launcher {
namespace {

using namespace rendezvous_test;
using ::testing::HasSubstr;

// --- connections --------------------------------------------------------------------

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
