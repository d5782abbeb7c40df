// The rpc plugin (libddprun_rpc.so): the multi-node control plane over gRPC,
// the single-node workers' server, and the `rendezvous` / `health` subcommands.

#include <thread>

#include "ddp/common/endpoint.h"
#include "ddp/common/grpc_logging.h"
#include "ddp/common/rendezvous_client.h"
#include "heartbeat_monitor.h"
#include "rendezvous_service.h"
#include "rpc_plugin.h"
#include "subcommands.h"

namespace ddp::launcher {
namespace {

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
}

RendezvousConfig server_config(const LaunchSpec& spec, int min_nodes, int max_nodes) {
  RendezvousConfig config;
  config.run_id = spec.run_id;
  config.token = spec.rdzv_token;
  config.min_nodes = min_nodes;
  config.max_nodes = max_nodes;
  config.join_timeout = to_ms(spec.rdzv_conf.join_timeout_s);
  config.last_call_timeout = to_ms(spec.rdzv_conf.last_call_timeout_s);
  config.heartbeat_timeout = to_ms(spec.rdzv_conf.heartbeat_timeout_s);
  config.max_restarts = spec.max_restarts;
  apply_limits(spec.rdzv_conf, config);
  return config;
}

class HeartbeatWatch final : public RoundWatch {
 public:
  HeartbeatWatch(RendezvousClient& client, const RoundAssignment& round, const RdzvConf& conf)
      : monitor_(client, round.round, round.group_rank, to_ms(conf.heartbeat_interval_s),
                 to_ms(conf.heartbeat_timeout_s)) {}
  int event_fd() const override { return monitor_.event_fd(); }
  std::optional<RoundStatus> ended() override { return monitor_.ended(); }
  std::string lost() override { return monitor_.lost(); }

 private:
  HeartbeatMonitor monitor_;
};

class RemoteControlPlane final : public ControlPlane {
 public:
  explicit RemoteControlPlane(const LaunchSpec& spec) : spec_(spec) {
    Endpoint endpoint{spec.rdzv_host, spec.rdzv_port};
    if (spec.hosts_rendezvous()) {
      ServerOptions options;
      options.host = "::";  // every interface: the other nodes connect from elsewhere
      options.port = spec.rdzv_port;
      options.tls_cert = spec.tls_cert;
      options.tls_key = spec.tls_key;
      options.max_message_bytes = static_cast<int>(spec.rdzv_conf.max_message_bytes);
      auto config = server_config(spec, spec.min_nodes, spec.nnodes);
      try {
        server_ = std::make_unique<RendezvousServer>(config, options);
      } catch (const Error& e) {
        options.host = "0.0.0.0";  // a host without IPv6
        try {
          server_ = std::make_unique<RendezvousServer>(config, options);
        } catch (const Error&) {
          throw Error("--rdzv_endpoint=" + spec.rdzv_endpoint + ": " + e.what());
        }
      }
      endpoint.port = server_->port();
    }
    // TLS certificates name a host, so the client keeps the endpoint's name.
    endpoint_ = endpoint.to_string();
    client_ = std::make_unique<RendezvousClient>(endpoint_, spec.run_id, spec.rdzv_token,
                                                 TlsFiles{spec.tls_cert, spec.tls_key, spec.tls_ca});
  }

  std::string worker_endpoint() const override { return endpoint_; }

  RoundAssignment join(const NodeInfo& node, std::chrono::milliseconds timeout) override {
    return client_->join(node, timeout);
  }
  bool report_failure(const RoundAssignment& round, const std::string& report, int exit_code) override {
    return client_->report_failure(round.round, round.group_rank, report, exit_code);
  }
  void leave(const RoundAssignment& round, int exit_code) override {
    client_->leave(round.round, round.group_rank, exit_code);
  }
  std::unique_ptr<RoundWatch> watch(const RoundAssignment& round) override {
    return std::make_unique<HeartbeatWatch>(*client_, round, spec_.rdzv_conf);
  }
  void linger(const RoundAssignment& round) override {
    if (!server_ || round.group_world_size <= 1) return;
    std::this_thread::sleep_for(to_ms(2 * spec_.rdzv_conf.heartbeat_interval_s + 0.5));
  }

 private:
  const LaunchSpec& spec_;
  std::unique_ptr<RendezvousServer> server_;
  std::unique_ptr<RendezvousClient> client_;
  std::string endpoint_;
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
  int health_command(const std::vector<std::string>& argv) override { return run_health_command(argv); }
};

}  // namespace
}  // namespace ddp::launcher

extern "C" ddp::launcher::RpcPlugin* ddprun_rpc_plugin() {
  static ddp::launcher::Plugin plugin;
  return &plugin;
}
