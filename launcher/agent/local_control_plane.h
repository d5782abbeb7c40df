#pragma once
// LocalControlPlane: the control plane of a single-node job. Rounds and the
// restart budget are decided here, without RPC; the workers' rendezvous
// server (store, barriers) is started on a background thread that loads the
// rpc plugin while the workers start, on a port reserved up front.

#include <future>

#include "agent/control_plane.h"
#include "agent/port_reservation.h"
#include "agent/rpc_plugin.h"
#include "cli/launch_spec.h"

namespace ddp::launcher {

class LocalControlPlane final : public ControlPlane {
 public:
  explicit LocalControlPlane(const LaunchSpec& spec);  // throws ddp::Error (port)
  ~LocalControlPlane() override;

  std::string worker_endpoint() const override;
  std::string workers_server_missing() const override { return missing_; }
  RoundAssignment join(const NodeInfo& node, std::chrono::milliseconds timeout,
                       const JoinWait& wait) override;
  bool report_failure(const RoundAssignment& round, const std::string& report,
                      int exit_code) override;
  int restarts_left() const override { return spec_.max_restarts - restarts_used_; }
  int spend_restart() override;
  void leave(const RoundAssignment& round, int exit_code) override;
  std::unique_ptr<RoundWatch> watch(const RoundAssignment& round) override;
  void publish(const NodeStatus& node) override;

 private:
  const LaunchSpec& spec_;
  PortReservation reservation_;
  std::string host_;
  std::int64_t rounds_ = 0;
  int restarts_used_ = 0;
  std::string missing_;  // why no server was started, when the plugin is not there
  std::future<std::unique_ptr<WorkerRendezvous>> server_;
  std::unique_ptr<WorkerRendezvous> server_ready_;  // taken from server_ once it is ready
};

}  // namespace ddp::launcher
