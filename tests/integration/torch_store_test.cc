// The rendezvous server's torch store (launcher/store/torch_store.h) against
// real torch.distributed.TCPStore clients: torch 2.x (DDP_TORCH_PYTHON) and
// Debian's torch 1.13, each method of the c10d store API and what
// init_process_group("gloo"), DDP and barrier() send through env:// with
// TORCHELASTIC_USE_AGENT_STORE=True; gRPC on the same port meanwhile; and,
// over raw sockets, what closes a connection (one log line) and what does not.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "ddp/common/rendezvous_client.h"
#include "debian_torch.h"
#include "rpc/rendezvous_service.h"
#include "store/torch_store_protocol.h"
#include "subprocess.h"
#include "torch_env.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
using launcher::RendezvousConfig;
using launcher::RendezvousServer;
using launcher::ServerOptions;
namespace ts = launcher::torch_store;

const std::string kClientScript = TORCH_STORE_CLIENT_PY;

ts::Query Q(ts::Op op, std::vector<std::string> keys = {}, std::vector<std::string> values = {},
            int64_t number = 0, uint32_t nonce = 0) {
  ts::Query q;
  q.op = op;
  q.keys = std::move(keys);
  q.values = std::move(values);
  q.number = number;
  q.nonce = nonce;
  return q;
}

// A connection speaking the wire protocol by hand.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~RawClient() { close(fd_); }
  bool connected() const { return connected_; }
  void send_bytes(const std::string& bytes) {
    ASSERT_EQ(send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  void send_query(const ts::Query& q, ts::Dialect d = ts::Dialect::kModern) {
    send_bytes(ts::encode(q, d));
  }
  // Exactly n bytes, or what came before EOF or the timeout.
  std::string receive(size_t n, std::chrono::milliseconds timeout = 5s) {
    std::string got;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (got.size() < n) {
      pollfd p{fd_, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char buf[4096];
      const ssize_t r = recv(fd_, buf, std::min(sizeof buf, n - got.size()), 0);
      if (r <= 0) break;
      got.append(buf, static_cast<size_t>(r));
    }
    return got;
  }
  // Whether the server closed the connection within the timeout.
  bool closed_by_server(std::chrono::milliseconds timeout = 5s) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
    char c;
    return recv(fd_, &c, 1, 0) <= 0;
  }
  void validate() { send_query(Q(ts::Op::kValidate, {}, {}, 0, ts::kValidationMagic)); }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

std::string u64_bytes(uint64_t n) {
  return std::string(reinterpret_cast<const char*>(&n), sizeof n);
}
std::string value_reply(const std::string& value) { return u64_bytes(value.size()) + value; }

class TorchStore : public ::testing::Test {
 protected:
  void SetUp() override { start({}); }
  void start(const launcher::RendezvousLimits& limits) {
    server_.reset();
    RendezvousConfig config;
    config.run_id = "ts";
    config.token = "secret";
    config.limits = limits;
    ServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    options.torch_store = true;
    options.max_message_bytes = 1 << 20;
    server_ = std::make_unique<RendezvousServer>(config, options);
  }
  int port() const { return server_->port(); }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port()); }
  // Runs the client script in `python` (mode store or group) and expects its OK line.
  void run_client(const std::string& python, const std::string& mode) {
    ProcessResult r = run_process({python, kClientScript, std::to_string(port()), mode}, {}, 90s);
    ASSERT_TRUE(r.exited) << python << " " << mode << " did not finish\n" << r.out << r.err;
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("TORCH STORE OK " + mode), std::string::npos) << r.out << r.err;
  }
  std::unique_ptr<RendezvousServer> server_;
};

TEST_F(TorchStore, EveryMethodOfATorch2Client) {
  if (auto why = torch2_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  run_client(torch2_python(), "store");
}

TEST_F(TorchStore, EveryMethodOfDebiansTorch113Client) {
  if (auto why = torch_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  run_client(kDebianPython, "store");
}

TEST_F(TorchStore, GlooInitDdpAndBarrierOfTorch2ThroughTheAgentStore) {
  if (auto why = torch2_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  run_client(torch2_python(), "group");
}

TEST_F(TorchStore, GlooInitDdpAndBarrierOfTorch113ThroughTheAgentStore) {
  if (auto why = torch_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  run_client(kDebianPython, "group");
}

TEST_F(TorchStore, GrpcAndTheStoreShareOnePort) {
  RawClient torch(port());
  ASSERT_TRUE(torch.connected());
  torch.validate();
  torch.send_query(Q(ts::Op::kSet, {"/k"}, {"torch"}));
  RendezvousClient grpc(endpoint(), "ts", "secret");
  grpc.set("k", "grpc");
  EXPECT_EQ(grpc.get("k", 5s), "grpc");
  torch.send_query(Q(ts::Op::kGet, {"/k"}));
  EXPECT_EQ(torch.receive(13), value_reply("torch"));  // two stores: the program's keys are its own
  torch.send_query(Q(ts::Op::kPing, {}, {}, 0, 77));
  EXPECT_EQ(torch.receive(4), std::string("\x4d\0\0\0", 4));
}

TEST_F(TorchStore, ALegacyClientIsToldApartFromAModernOne) {
  RawClient old(port());
  old.send_query(Q(ts::Op::kSet, {"/a"}, {"1"}), ts::Dialect::kLegacy);  // type 0 without the magic
  old.send_query(Q(ts::Op::kAdd, {"/a"}, {}, 4), ts::Dialect::kLegacy);
  EXPECT_EQ(old.receive(8), u64_bytes(5));
  old.send_query(Q(ts::Op::kDeleteKey, {"/a"}), ts::Dialect::kLegacy);
  EXPECT_EQ(old.receive(8), u64_bytes(1));
}

TEST_F(TorchStore, AWaitIsReleasedBySetAndEndedByCancel) {
  RawClient waiter(port()), setter(port());
  waiter.validate();
  setter.validate();
  waiter.send_query(Q(ts::Op::kWait, {"/x", "/y"}));
  setter.send_query(Q(ts::Op::kSet, {"/x"}, {"1"}));
  EXPECT_EQ(waiter.receive(1, 300ms), "") << "released before /y was set";
  setter.send_query(Q(ts::Op::kSet, {"/y"}, {"2"}));
  EXPECT_EQ(waiter.receive(1), std::string(1, '\0'));  // STOP_WAITING
  waiter.send_query(Q(ts::Op::kWait, {"/never"}));
  waiter.send_query(Q(ts::Op::kCancelWait));
  EXPECT_EQ(waiter.receive(1), std::string(1, '\1'));  // WAIT_CANCELED
  setter.send_query(Q(ts::Op::kSet, {"/never"}, {"late"}));
  setter.send_query(Q(ts::Op::kPing, {}, {}, 0, 1));
  ASSERT_EQ(setter.receive(4).size(), 4u);  // the SET is done
  waiter.send_query(Q(ts::Op::kNumKeys));
  EXPECT_EQ(waiter.receive(8), u64_bytes(3)) << "a cancelled wait was answered";
}

// BARRIER(key, n): nobody passes before the n-th arrival, then everybody.
TEST_F(TorchStore, ABarrierReleasesEveryArrivalAtOnce) {
  RawClient a(port()), b(port()), c(port());
  for (RawClient* x : {&a, &b, &c}) x->validate();
  a.send_query(Q(ts::Op::kBarrier, {"/b"}, {}, 3));
  b.send_query(Q(ts::Op::kBarrier, {"/b"}, {}, 3));
  EXPECT_EQ(a.receive(1, 300ms), "");
  c.send_query(Q(ts::Op::kBarrier, {"/b"}, {}, 3));
  for (RawClient* x : {&a, &b, &c}) EXPECT_EQ(x->receive(1), std::string(1, '\0'));
}

struct Refused {
  const char* what;
  std::string bytes;  // sent after VALIDATE (modern) or alone (legacy)
  bool legacy;
  const char* log;  // in the one line the server logs
};

TEST_F(TorchStore, AMalformedOrUnknownQueryClosesOnlyItsConnectionWithOneLogLine) {
  const std::vector<Refused> cases = {
      {"unknown type", std::string(1, '\x13'), false, "unknown query type 19"},
      {"VALIDATE twice",
       ts::encode(Q(ts::Op::kValidate, {}, {}, 0, ts::kValidationMagic), ts::Dialect::kModern),
       false, "VALIDATE after the connection's first query"},
      {"key over max_key_bytes", std::string(1, '\x03') + u64_bytes(5000), false,
       "key of 5000 bytes, limit 4096"},
      {"value over the query limit",
       std::string(1, '\x01') + u64_bytes(2) + "/k" + u64_bytes(4 << 20), false,
       "bytes (--rdzv_conf max_message_bytes)"},
      {"a list too long", std::string(1, '\x06') + u64_bytes(uint64_t{1} << 40), false,
       "a list of"},
      {"legacy WATCH_KEY", std::string(1, '\x07') + u64_bytes(2) + "/k", true, "WATCH_KEY"},
      {"ADD to text",
       ts::encode(Q(ts::Op::kSet, {"/t"}, {"text"}), ts::Dialect::kModern) +
           ts::encode(Q(ts::Op::kAdd, {"/t"}, {}, 1), ts::Dialect::kModern),
       false, "is not a decimal int64"},
  };
  RawClient bystander(port());
  bystander.validate();
  for (const Refused& c : cases) {
    ::testing::internal::CaptureStderr();
    RawClient bad(port());
    if (!c.legacy) bad.validate();
    bad.send_bytes(c.bytes);
    const bool closed = bad.closed_by_server();
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_TRUE(closed) << c.what;
    EXPECT_NE(log.find("torch store: closed the connection from 127.0.0.1:"), std::string::npos)
        << c.what << log;
    EXPECT_NE(log.find(c.log), std::string::npos) << c.what << ": " << log;
    EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << c.what << ": " << log;
  }
  bystander.send_query(Q(ts::Op::kAdd, {"/n"}, {}, 2));
  EXPECT_EQ(bystander.receive(8), u64_bytes(2)) << "another connection was disturbed";
}

TEST_F(TorchStore, TheRendezvousLimitsBoundItsKeysAndQueues) {
  launcher::RendezvousLimits limits;
  limits.max_keys = 3;
  limits.max_store_bytes = 4096;
  start(limits);
  RawClient c(port());
  c.validate();
  for (const char* key : {"/1", "/2", "/3"}) c.send_query(Q(ts::Op::kSet, {key}, {"v"}));
  c.send_query(Q(ts::Op::kNumKeys));
  EXPECT_EQ(c.receive(8), u64_bytes(3));
  ::testing::internal::CaptureStderr();
  c.send_query(Q(ts::Op::kSet, {"/4"}, {"v"}));
  EXPECT_TRUE(c.closed_by_server());
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("limit 3 (--rdzv_conf max_keys)"), std::string::npos) << log;
  RawClient q(port());
  q.validate();
  ::testing::internal::CaptureStderr();
  q.send_query(Q(ts::Op::kQueuePush, {"/q"}, {std::string(5000, 'x')}));
  EXPECT_TRUE(q.closed_by_server());
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("(--rdzv_conf max_store_bytes)"),
            std::string::npos);
  EXPECT_EQ(server_->torch_store()->num_keys(), 3u);
}

// Its answers unread, a client is not read either: pipelined queries wait in
// the kernel, and the answers all arrive once it reads.
TEST_F(TorchStore, AClientThatDoesNotReadIsNotReadEither) {
  RawClient c(port());
  c.validate();
  const std::string value(256 << 10, 'v');
  c.send_query(Q(ts::Op::kSet, {"/big"}, {value}));
  std::thread sender([&] {
    for (int i = 0; i < 64; ++i) c.send_query(Q(ts::Op::kGet, {"/big"}));
  });
  std::this_thread::sleep_for(500ms);
  for (int i = 0; i < 64; ++i)
    ASSERT_EQ(c.receive(8 + value.size()), value_reply(value)) << "answer " << i;
  sender.join();
}

TEST_F(TorchStore, EachRoundStartsWithAnEmptyStore) {
  RawClient c(port());
  c.validate();
  c.send_query(Q(ts::Op::kSet, {"/default_pg/0//cpu//rank_0"}, {"old address"}));
  c.send_query(Q(ts::Op::kNumKeys));
  EXPECT_EQ(c.receive(8), u64_bytes(1));
  RendezvousClient agent(endpoint(), "ts", "secret");
  agent.join({0, 1, "host", "127.0.0.1", 29500}, 10s);  // one node: the round forms at once
  c.send_query(Q(ts::Op::kNumKeys));
  EXPECT_EQ(c.receive(8), u64_bytes(0)) << "the last round's keys survived";
}

}  // namespace
}  // namespace ddp::testing
