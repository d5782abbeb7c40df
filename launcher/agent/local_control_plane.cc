#include "agent/local_control_plane.h"

#include "ddp/common/endpoint.h"
#include "ddp/common/launcher_log.h"

namespace ddp::launcher {

LocalControlPlane::LocalControlPlane(const LaunchSpec& spec)
    : spec_(spec),
      reservation_(PortReservation::reserve(spec.rdzv_port, "--rdzv_endpoint")),
      host_(spec.rdzv_host) {
  // A missing plugin is found before the workers start, so that a worker
  // needing the server fails at once instead of after its connect timeout.
  missing_ = rpc_plugin_missing();
  if (!missing_.empty()) {
    launcher_log().warn("workers' rendezvous server not started: {}", missing_);
    return;
  }
  const LaunchSpec* s = &spec_;
  int port = reservation_.port();
  server_ = std::async(std::launch::async, [s, port]() -> std::unique_ptr<WorkerRendezvous> {
    try {
      return load_rpc_plugin().serve_workers(*s, port);
    } catch (const std::exception& e) {
      // Workers that use the store will fail with a clear error of their own;
      // programs that do not (most torch scripts) are unaffected.
      launcher_log().warn("workers' rendezvous server did not start: {}", e.what());
      return nullptr;
    }
  });
}

LocalControlPlane::~LocalControlPlane() = default;

std::string LocalControlPlane::worker_endpoint() const {
  return Endpoint{host_, reservation_.port()}.to_string();
}

RoundAssignment LocalControlPlane::join(const NodeInfo& node, std::chrono::milliseconds,
                                        const JoinWait&) {
  RoundAssignment a;
  a.round = ++rounds_;
  a.group_rank = 0;
  a.group_world_size = 1;
  a.world_size = node.local_world_size;
  a.global_rank_offset = 0;
  a.master_addr = node.address;
  a.master_port = node.master_port;
  a.restart_count = restarts_used_;
  return a;
}

bool LocalControlPlane::report_failure(const RoundAssignment&, const std::string&, int) {
  if (restarts_used_ >= spec_.max_restarts) return false;
  ++restarts_used_;
  return true;
}

int LocalControlPlane::spend_restart() {
  if (restarts_used_ >= spec_.max_restarts) return 0;
  return ++restarts_used_;
}

void LocalControlPlane::leave(const RoundAssignment&, int) {}

std::unique_ptr<RoundWatch> LocalControlPlane::watch(const RoundAssignment&) { return nullptr; }

void LocalControlPlane::publish(const NodeStatus& node) {
  // The server loads on its thread while the first workers start: until it
  // is there, there is nobody to tell.
  if (!server_ready_ && server_.valid() &&
      server_.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    server_ready_ = server_.get();
  }
  if (server_ready_) server_ready_->publish(node);
}

}  // namespace ddp::launcher
