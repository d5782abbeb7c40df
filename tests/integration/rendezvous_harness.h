#pragma once
// What the rendezvous service's integration tests share: an in-process
// RendezvousServer on an ephemeral port, clients and raw stubs for it, and
// small helpers over RpcError.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "ddp/common/rendezvous_client.h"
#include "ddp/v1/rendezvous.grpc.pb.h"
#include "rpc/rendezvous_service.h"

namespace ddp::launcher::rendezvous_test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr char kRunId[] = "run-it";
constexpr char kToken[] = "token-it";

inline RendezvousConfig make_config(int min_nodes = 1, int max_nodes = 1) {
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

inline int code(RpcCode c) { return static_cast<int>(c); }

inline double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

inline v1::Auth good_auth() {
  v1::Auth a;
  a.set_run_id(kRunId);
  a.set_token(kToken);
  return a;
}

// --- store --------------------------------------------------------------------------

// Two nodes joined into one round of make_config(2, 2).
inline std::pair<RoundAssignment, RoundAssignment> form_two(RendezvousClient& a,
                                                            RendezvousClient& b) {
  auto ja = std::async(std::launch::async, [&] {
    return a.join({0, 1, "node-a", "10.0.0.1", 29501}, 10s);
  });
  auto jb = std::async(std::launch::async, [&] {
    return b.join({1, 1, "node-b", "10.0.0.2", 0}, 10s);
  });
  return {ja.get(), jb.get()};
}

}  // namespace ddp::launcher::rendezvous_test
