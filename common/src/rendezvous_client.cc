#include "ddp/common/rendezvous_client.h"

#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "ddp/common/flag_file.h"
#include "ddp/v1/rendezvous.grpc.pb.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
// Slack between an operation's own timeout (enforced by the server, which
// then names what was missing) and the RPC deadline (the network's bound).
constexpr auto kRpcSlack = 2s;
constexpr auto kEagerReconnect = 2s;  // how long a join retries a refused connection eagerly
constexpr auto kUnaryDeadline = 30s;

}  // namespace

struct RendezvousClient::Impl {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Rendezvous::Stub> stub;
  v1::Auth auth;
  // The id the last join() got (RoundAssignment::member), sent with this
  // node's heartbeats, failure reports and leave.
  std::atomic<std::uint64_t> member{0};

  void check(const grpc::Status& status, const std::string& what,
             const std::string& endpoint) const {
    if (status.ok()) return;
    const int code = static_cast<int>(status.error_code());
    throw RpcError(code,
                   "rendezvous " + endpoint + ": " + what + ": " + rpc_code_name(code) + ": " +
                       status.error_message(),
                   status.error_details());
  }
  // Waits for the server to be reachable (the in-process server of a
  // single-node job may still be starting when workers call) up to `d`.
  static void deadline(grpc::ClientContext& ctx, std::chrono::milliseconds d) {
    ctx.set_deadline(std::chrono::system_clock::now() + d);
    ctx.set_wait_for_ready(true);
  }
  // One unary request: the token, the deadline (waiting for the server to be
  // reachable), the call, and a refusal turned into RpcError naming `what`.
  template <class Request, class Response>
  Response call(grpc::Status (v1::Rendezvous::Stub::*method)(grpc::ClientContext*, const Request&,
                                                             Response*),
                Request req, std::chrono::milliseconds d, const std::string& what,
                const std::string& endpoint) {
    *req.mutable_auth() = auth;
    Response resp;
    grpc::ClientContext ctx;
    deadline(ctx, d);
    check((stub.get()->*method)(&ctx, req, &resp), what, endpoint);
    return resp;
  }
};

RendezvousClient::RendezvousClient(const std::string& endpoint, std::string run_id,
                                   std::string token, const TlsFiles& tls)
    : impl_(std::make_unique<Impl>()), endpoint_(endpoint) {
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (tls.enabled()) {
    grpc::SslCredentialsOptions opts;
    if (!tls.ca.empty()) opts.pem_root_certs = read_flag_file("--rdzv_tls_ca", tls.ca);
    if (!tls.cert.empty()) {
      opts.pem_cert_chain = read_flag_file("--rdzv_tls_cert", tls.cert);
      opts.pem_private_key = read_flag_file("--rdzv_tls_key", tls.key);
    }
    creds = grpc::SslCredentials(opts);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 20);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 20);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  // Each worker and agent gets its own connection (no sharing of subchannels
  // across clients in one process, which would serialise their waits).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  impl_->channel = grpc::CreateCustomChannel(endpoint, creds, args);
  impl_->stub = v1::Rendezvous::NewStub(impl_->channel);
  impl_->auth.set_run_id(std::move(run_id));
  impl_->auth.set_token(std::move(token));
}

RendezvousClient::~RendezvousClient() = default;

namespace {

RoundAssignment assignment_of(const v1::JoinResponse& resp) {
  RoundAssignment a;
  a.round = resp.round();
  a.group_rank = resp.group_rank();
  a.group_world_size = resp.group_world_size();
  a.world_size = resp.world_size();
  a.global_rank_offset = resp.global_rank_offset();
  a.master_addr = resp.master_addr();
  a.master_port = resp.master_port();
  a.restart_count = resp.restart_count();
  a.reason = resp.reason();
  a.member = resp.member();
  a.joined_running = resp.joined_running();
  return a;
}

}  // namespace

RoundAssignment RendezvousClient::join(const NodeInfo& node, std::chrono::milliseconds timeout,
                                       const JoinWait& wait) {
  v1::JoinRequest req;
  *req.mutable_auth() = impl_->auth;
  req.set_node_rank(node.node_rank);
  req.set_local_world_size(node.local_world_size);
  req.set_hostname(node.hostname);
  req.set_address(node.address);
  req.set_master_port(node.master_port);
  v1::JoinResponse resp;
  grpc::ClientContext ctx;
  Impl::deadline(ctx,
                 timeout + kRpcSlack);  // retries an unreachable server with backoff until then

  // The call runs on gRPC's threads; this thread waits on an eventfd the
  // callback writes, beside the caller's fd (a signalfd), so a signal can
  // cancel the join at once. The callback always runs, cancelled or not, and
  // is waited for before anything it touches goes out of scope.
  int done_fd = eventfd(0, EFD_CLOEXEC);
  if (done_fd < 0) throw Error(std::string("eventfd: ") + std::strerror(errno));
  grpc::Status status;
  impl_->stub->async()->Join(&ctx, &req, &resp, [&status, done_fd](grpc::Status s) {
    status = std::move(s);
    const std::uint64_t one = 1;
    ssize_t ignored = ::write(done_fd, &one, sizeof one);
    (void)ignored;
  });
  auto await_done = [&](int ms) {
    pollfd pfd{done_fd, POLLIN, 0};
    return ::poll(&pfd, 1, ms) > 0;
  };
  const auto started = std::chrono::steady_clock::now();
  bool noticed = false, interrupted = false;
  for (;;) {
    // gRPC waits at least 100 ms between connection attempts (its backoff
    // floor), and the nodes of a job start together, a few ms before the host
    // listens: early in a join, a refused connection is retried every 10 ms.
    const bool early = std::chrono::steady_clock::now() - started < kEagerReconnect;
    if (early && impl_->channel->GetState(false) == GRPC_CHANNEL_TRANSIENT_FAILURE) {
      grpc::experimental::ChannelResetConnectionBackoff(impl_->channel.get());
    }
    pollfd pfds[2] = {{done_fd, POLLIN, 0}, {wait.fd, POLLIN, 0}};
    int ready = ::poll(pfds, wait.fd >= 0 ? 2 : 1, early ? 10 : 1000);
    if (ready > 0 && (pfds[0].revents & POLLIN)) break;
    if (ready > 0 && (pfds[1].revents & POLLIN) && wait.interrupted && wait.interrupted()) {
      interrupted = true;
      ctx.TryCancel();
      while (!await_done(1000)) {
      }
      break;
    }
    if (!noticed && wait.notice && std::chrono::steady_clock::now() - started > 5s &&
        impl_->channel->GetState(false) == GRPC_CHANNEL_TRANSIENT_FAILURE) {
      noticed = true;
      wait.notice("the rendezvous at " + endpoint_ +
                  " is not reachable yet; retrying until the join timeout");
    }
  }
  ::close(done_fd);
  if (interrupted) {
    const bool reached = impl_->channel->GetState(false) == GRPC_CHANNEL_READY;
    throw JoinInterrupted(reached ? "the other nodes to join at the rendezvous " + endpoint_
                                  : "the rendezvous at " + endpoint_ + " to become reachable");
  }
  // This call's own deadline passed (not a server's answer that a wait of
  // its own ran out): nothing answered within the join timeout.
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
      std::chrono::system_clock::now() >= ctx.deadline()) {
    throw RpcError(static_cast<int>(status.error_code()),
                   "rendezvous " + endpoint_ + ": Join: no answer within the join timeout (" +
                       std::to_string(timeout.count() / 1000.0).substr(0, 6) +
                       " s, --rdzv_conf join_timeout): is the server running and reachable?");
  }
  impl_->check(status, "Join", endpoint_);
  RoundAssignment assigned = assignment_of(resp);
  impl_->member = assigned.member;
  return assigned;
}

void CallCanceller::cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  if (context_ != nullptr) static_cast<grpc::ClientContext*>(context_)->TryCancel();
}

bool CallCanceller::attach(void* context) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) return false;
  context_ = context;
  return true;
}

void CallCanceller::detach() {
  std::lock_guard<std::mutex> lock(mu_);
  context_ = nullptr;
}

RoundStatus RendezvousClient::heartbeat(std::int64_t round, int group_rank,
                                        std::chrono::milliseconds timeout,
                                        std::chrono::milliseconds hold, CallCanceller* canceller,
                                        const std::string& node_state) {
  v1::HeartbeatRequest req;
  *req.mutable_auth() = impl_->auth;
  req.set_round(round);
  req.set_group_rank(group_rank);
  req.set_member(impl_->member);
  if (!node_state.empty()) (void)req.mutable_node_state()->ParseFromString(node_state);
  req.set_hold_ms(static_cast<std::uint32_t>(std::max<std::int64_t>(hold.count(), 0)));
  v1::HeartbeatResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + hold +
                   timeout);  // fail fast: silence is the signal
  if (canceller != nullptr && !canceller->attach(&ctx)) {
    throw RpcError(RpcCode::kCancelled, "rendezvous " + endpoint_ + ": Heartbeat: cancelled");
  }
  grpc::Status status = impl_->stub->Heartbeat(&ctx, req, &resp);
  if (canceller != nullptr) canceller->detach();
  impl_->check(status, "Heartbeat", endpoint_);
  return {resp.round_ended(), resp.succeeded(), resp.can_restart(), resp.reason()};
}

void RendezvousClient::acknowledge_end(std::int64_t round, int group_rank,
                                       std::chrono::milliseconds timeout) {
  v1::HeartbeatRequest req;
  *req.mutable_auth() = impl_->auth;
  req.set_round(round);
  req.set_group_rank(group_rank);
  req.set_member(impl_->member);
  req.set_heard_end(true);
  v1::HeartbeatResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  (void)impl_->stub->Heartbeat(&ctx, req,
                               &resp);  // the host waits at most its close_timeout anyway
}

bool RendezvousClient::report_failure(std::int64_t round, int group_rank, const std::string& report,
                                      int exit_code, std::chrono::milliseconds deadline) {
  v1::ReportFailureRequest req;
  req.set_round(round);
  req.set_group_rank(group_rank);
  req.set_member(impl_->member);
  req.set_report(report);
  req.set_exit_code(exit_code);
  const auto resp = impl_->call(&v1::Rendezvous::Stub::ReportFailure, std::move(req), deadline,
                                "ReportFailure", endpoint_);
  return resp.can_restart();
}

void RendezvousClient::leave(std::int64_t round, int group_rank, int exit_code) {
  v1::LeaveRequest req;
  req.set_round(round);
  req.set_group_rank(group_rank);
  req.set_member(impl_->member);
  req.set_exit_code(exit_code);
  impl_->call(&v1::Rendezvous::Stub::Leave, std::move(req), kUnaryDeadline, "Leave", endpoint_);
}

void RendezvousClient::set(const std::string& key, const std::string& value) {
  v1::SetRequest req;
  req.set_key(key);
  req.set_value(value);
  impl_->call(&v1::Rendezvous::Stub::Set, std::move(req), kUnaryDeadline, "Set '" + key + "'",
              endpoint_);
}

std::optional<std::string> RendezvousClient::try_get(const std::string& key) {
  v1::GetRequest req;
  req.set_key(key);
  const auto resp = impl_->call(&v1::Rendezvous::Stub::Get, std::move(req), kUnaryDeadline,
                                "Get '" + key + "'", endpoint_);
  if (!resp.found()) return std::nullopt;
  return resp.value();
}

std::string RendezvousClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  v1::GetRequest req;
  req.set_key(key);
  req.set_wait(true);
  req.set_timeout_ms(timeout.count());
  const auto resp = impl_->call(&v1::Rendezvous::Stub::Get, std::move(req), timeout + kRpcSlack,
                                "Get '" + key + "'", endpoint_);
  return resp.value();
}

std::int64_t RendezvousClient::add(const std::string& key, std::int64_t delta) {
  v1::AddRequest req;
  req.set_key(key);
  req.set_delta(delta);
  const auto resp = impl_->call(&v1::Rendezvous::Stub::Add, std::move(req), kUnaryDeadline,
                                "Add '" + key + "'", endpoint_);
  return resp.value();
}

CompareSetOutcome RendezvousClient::compare_set(const std::string& key, const std::string& expected,
                                                const std::string& desired) {
  v1::CompareSetRequest req;
  req.set_key(key);
  req.set_expected(expected);
  req.set_desired(desired);
  const auto resp = impl_->call(&v1::Rendezvous::Stub::CompareSet, std::move(req), kUnaryDeadline,
                                "CompareSet '" + key + "'", endpoint_);
  return {resp.swapped(), resp.current()};
}

void RendezvousClient::wait(const std::vector<std::string>& keys,
                            std::chrono::milliseconds timeout) {
  v1::WaitRequest req;
  for (const auto& k : keys) req.add_keys(k);
  req.set_timeout_ms(timeout.count());
  impl_->call(&v1::Rendezvous::Stub::Wait, std::move(req), timeout + kRpcSlack, "Wait", endpoint_);
}

bool RendezvousClient::remove(const std::string& key) {
  v1::DeleteRequest req;
  req.set_key(key);
  const auto resp = impl_->call(&v1::Rendezvous::Stub::Delete, std::move(req), kUnaryDeadline,
                                "Delete '" + key + "'", endpoint_);
  return resp.deleted();
}

std::int64_t RendezvousClient::num_keys() {
  v1::NumKeysRequest req;
  const auto resp = impl_->call(&v1::Rendezvous::Stub::NumKeys, std::move(req), kUnaryDeadline,
                                "NumKeys", endpoint_);
  return resp.count();
}

void RendezvousClient::barrier(const std::string& name, int rank, int world_size,
                               std::chrono::milliseconds timeout, const std::string& host) {
  v1::BarrierRequest req;
  req.set_name(name);
  req.set_rank(rank);
  req.set_world_size(world_size);
  req.set_timeout_ms(timeout.count());
  req.set_host(host);
  impl_->call(&v1::Rendezvous::Stub::Barrier, std::move(req), timeout + kRpcSlack,
              "Barrier '" + name + "'", endpoint_);
}

}  // namespace ddp
