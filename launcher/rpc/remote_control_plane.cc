// The rpc plugin (libddprun_rpc.so): the multi-node control plane over gRPC,
// the single-node workers' server, and the `rendezvous` / `health` subcommands.

#include <poll.h>

#include <algorithm>
#include <thread>

#include "agent/rpc_plugin.h"
#include "ddp/common/endpoint.h"
#include "ddp/common/grpc_logging.h"
#include "ddp/common/launcher_log.h"
#include "ddp/common/rendezvous_client.h"
#include "rpc/heartbeat_monitor.h"
#include "rpc/rendezvous_service.h"
#include "rpc/status_command.h"
#include "rpc/status_proto.h"
#include "rpc/subcommands.h"

namespace ddp::launcher {
namespace {

// Nodes report with their heartbeats, with what they sampled last: an
// interval is the longer of the two periods. nullopt: --straggler_window=0.
std::optional<StragglerRule> node_straggler_rule(const LaunchSpec& spec) {
  if (spec.straggler_window_s <= 0) return std::nullopt;
  return straggler_rule(spec.straggler_window_s,
                        std::max(spec.rdzv_conf.heartbeat_interval_s, spec.status_interval_s));
}

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
}

RendezvousConfig server_config(const LaunchSpec& spec, int min_nodes, int max_nodes) {
  RendezvousConfig config = rendezvous_config(spec.run_id, spec.rdzv_token, min_nodes, max_nodes,
                                              spec.max_restarts, spec.rdzv_conf);
  config.heal = spec.on_failure == OnFailure::kHeal;
  return config;
}

class HeartbeatWatch final : public RoundWatch {
 public:
  HeartbeatWatch(RendezvousClient& client, const RoundAssignment& round, const RdzvConf& conf,
                 std::shared_ptr<StatusSlot> status)
      : monitor_(client, round.round, round.group_rank, to_ms(conf.heartbeat_interval_s),
                 to_ms(conf.heartbeat_timeout_s), std::move(status)) {}
  int event_fd() const override { return monitor_.event_fd(); }
  std::optional<RoundStatus> ended() override { return monitor_.ended(); }
  std::string lost() override { return monitor_.lost(); }
  double heartbeat_age_s() const override { return monitor_.heartbeat_age_s(); }

 private:
  mutable HeartbeatMonitor monitor_;
};

class RemoteControlPlane final : public ControlPlane {
 public:
  explicit RemoteControlPlane(const LaunchSpec& spec) : spec_(spec) {
    auto& log = launcher_log();
    Endpoint endpoint{spec.rdzv_host, spec.rdzv_port};
    const bool guessed = spec.guesses_host() && is_local_host(spec.rdzv_host);
    if (spec.hosts_rendezvous() || guessed) {
      try {
        server_ = start_server(spec);
        server_->service().judge_node_stragglers(node_straggler_rule(spec));
        endpoint.port = server_->port();
        log.info(
            "hosting the rendezvous on port {} ({}; run id '{}'){}", endpoint.port,
            guessed ? "this node has the endpoint's address" : "this node's role", spec.run_id,
            spec.agent_store
                ? ", with torch.distributed's store for the workers (TORCHELASTIC_USE_AGENT_STORE)"
                : "");
      } catch (const Error& e) {
        if (!guessed) throw;
        // torchrun's rule: another agent on this machine got there first.
        log.info("joining the rendezvous at {} as a client (not hosting it here: {})",
                 endpoint.to_string(), e.what());
      }
    }
    if (spec.rdzv_token.empty() && (server_ || spec.node_rank <= 0)) {
      log.warn(
          "the rendezvous at {} is unauthenticated: anyone who can reach it can join or read its "
          "store; "
          "set DDP_RDZV_TOKEN (or --rdzv_token_file) to the same secret on every node to require "
          "one",
          endpoint.to_string());
    }
    // TLS certificates name a host, so the client keeps the endpoint's name.
    endpoint_ = endpoint.to_string();
    client_ =
        std::make_unique<RendezvousClient>(endpoint_, spec.run_id, spec.rdzv_token,
                                           TlsFiles{spec.tls_cert, spec.tls_key, spec.tls_ca});
  }

  std::string worker_endpoint() const override { return endpoint_; }

  // A full round answers UNAVAILABLE: ask again each second, saying so once,
  // until the join timeout; a signal ends the wait at once.
  RoundAssignment join(const NodeInfo& node, std::chrono::milliseconds timeout,
                       const JoinWait& wait) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    bool told = false;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      try {
        return client_->join(node, std::max(left, std::chrono::milliseconds(1)), wait);
      } catch (const RpcError& e) {
        // Only the server's "round is full" is a reason to wait; a transport
        // UNAVAILABLE (the server went away mid-join) is an error like any other.
        const bool full = e.is(RpcCode::kUnavailable) && e.reason() == kReasonRoundFull;
        if (!full || left <= std::chrono::seconds(1)) throw;
        if (!told) launcher_log().warn("waiting for a place: {}", e.what());
        told = true;
      }
      pollfd pfd{wait.fd, POLLIN, 0};
      if (::poll(&pfd, wait.fd >= 0 ? 1 : 0, 1000) > 0 && wait.interrupted && wait.interrupted()) {
        throw JoinInterrupted("a place in a round at the rendezvous " + endpoint_);
      }
    }
  }
  bool report_failure(const RoundAssignment& round, const std::string& report,
                      int exit_code) override {
    return client_->report_failure(round.round, round.group_rank, report, exit_code,
                                   short_deadline());
  }
  void leave(const RoundAssignment& round, int exit_code) override {
    client_->leave(round.round, round.group_rank, exit_code);
  }
  std::unique_ptr<RoundWatch> watch(const RoundAssignment& round) override {
    return std::make_unique<HeartbeatWatch>(*client_, round, spec_.rdzv_conf, status_);
  }
  void publish(const NodeStatus& node) override {
    std::string bytes = to_proto(node).SerializeAsString();
    std::lock_guard<std::mutex> lock(status_->mu);
    status_->bytes = std::move(bytes);
  }
  std::vector<NodeStragglerChange> take_node_straggler_changes() override {
    if (!server_) return {};
    return server_->service().take_node_straggler_changes();
  }
  std::vector<NodeStragglerScore> node_straggler_scores() const override {
    if (!server_) return {};
    return server_->service().node_straggler_scores();
  }
  // --on_failure=heal across nodes: relaunches of single ranks (and nodes
  // admitted into a running round) spend a job-wide budget of
  // --max_restarts kept as a counter in the rendezvous's store (atomic
  // across the agents), apart from the server's count of group restarts.
  int restarts_left() const override {
    return std::max<int>(
        0, spec_.max_restarts - static_cast<int>(client_->add(kHealRelaunchesKey, 0)));
  }
  int spend_restart() override {
    const auto spent = client_->add(kHealRelaunchesKey, 1);
    return spent <= spec_.max_restarts ? static_cast<int>(spent) : 0;
  }
  void note_exited(const RoundAssignment& round, int rank, long pid) override {
    try {
      client_->set(exited_rank_key(round.round, rank), std::to_string(pid));
    } catch (const Error&) {
      // The others then wait out their diagnosis window (a few seconds).
    }
  }
  bool outcome_delivered() const override {
    return !server_ || server_->service().outcome_delivered();
  }
  std::chrono::milliseconds linger_time() const override {
    if (!server_) return {};
    return close_time(spec_.rdzv_conf);
  }

 private:
  static std::unique_ptr<RendezvousServer> start_server(const LaunchSpec& spec) {
    ServerOptions options;
    options.host = "::";  // every interface: the other nodes connect from elsewhere
    options.port = spec.rdzv_port;
    options.tls_cert = spec.tls_cert;
    options.tls_key = spec.tls_key;
    options.max_message_bytes = static_cast<int>(spec.rdzv_conf.max_message_bytes);
    options.torch_store = spec.agent_store;
    auto config = server_config(spec, spec.min_nodes, spec.nnodes);
    // The port a user gave: --master_port for the agent store's, else --rdzv_endpoint.
    const std::string flag = spec.agent_store ? "--master_port=" + std::to_string(spec.master_port)
                                              : "--rdzv_endpoint=" + spec.rdzv_endpoint;
    try {
      return std::make_unique<RendezvousServer>(config, options);
    } catch (const Error& e) {
      options.host = "0.0.0.0";  // a host without IPv6
      try {
        return std::make_unique<RendezvousServer>(config, options);
      } catch (const Error&) {
        throw Error(flag + ": " + e.what());
      }
    }
  }
  // A stopping node reports within a bound: the server may be unreachable.
  std::chrono::milliseconds short_deadline() const {
    return to_ms(std::min(spec_.rdzv_conf.read_timeout_s, spec_.rdzv_conf.heartbeat_timeout_s));
  }

  const LaunchSpec& spec_;
  std::unique_ptr<RendezvousServer> server_;
  std::unique_ptr<RendezvousClient> client_;
  std::string endpoint_;
  std::shared_ptr<StatusSlot> status_ = std::make_shared<StatusSlot>();
};

// A single node's server listens on loopback (or the given host) without TLS:
// nothing leaves the machine by default, and workers need no certificate.
class WorkerServer final : public WorkerRendezvous {
 public:
  WorkerServer(const LaunchSpec& spec, int port) {
    ServerOptions options;
    options.host = spec.rdzv_host;
    options.port = port;
    options.max_message_bytes = static_cast<int>(spec.rdzv_conf.max_message_bytes);
    server_ = std::make_unique<RendezvousServer>(server_config(spec, 1, 1), options);
    server_->service().judge_node_stragglers(std::nullopt);  // one node: nothing to compare
  }
  void publish(const NodeStatus& node) override {
    server_->service().publish_local(to_proto(node));
  }

 private:
  std::unique_ptr<RendezvousServer> server_;
};

class Plugin final : public RpcPlugin {
 public:
  Plugin() { route_grpc_logs(); }
  std::unique_ptr<ControlPlane> multi_node_control_plane(const LaunchSpec& spec) override {
    return std::make_unique<RemoteControlPlane>(spec);
  }
  std::unique_ptr<WorkerRendezvous> serve_workers(const LaunchSpec& spec, int port) override {
    return std::make_unique<WorkerServer>(spec, port);
  }
  int rendezvous_command(const std::vector<std::string>& argv, int signal_fd) override {
    return run_rendezvous_command(argv, signal_fd);
  }
  int health_command(const std::vector<std::string>& argv) override {
    return run_health_command(argv);
  }
  int status_command(const std::vector<std::string>& argv) override {
    return run_status_command(argv);
  }
};

}  // namespace
}  // namespace ddp::launcher

extern "C" ddp::launcher::RpcPlugin* ddprun_rpc_plugin() {
  static ddp::launcher::Plugin plugin;
  return &plugin;
}
