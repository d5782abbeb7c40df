#pragma once
// MetricsServer: serves the metric set (metric_set.h) over HTTP for
// Prometheus (GET /metrics, nothing else; read-only) with prometheus-cpp's
// exposer, on every IPv4 interface. Built only when CMake found
// prometheus-cpp (DDP_HAVE_PROMETHEUS); otherwise constructing one is an
// error saying so. Thread-safe: update() from the agent's loop while the
// exposer's threads answer scrapes.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "observe/metric_set.h"

namespace ddp::launcher {

class MetricsServer {
 public:
  // Listens on `port` now; throws ddp::Error naming --metrics_port when the
  // port is taken or metrics are not built in. `constant`: labels every
  // series carries (run_id, host, node_rank).
  MetricsServer(int port, const std::map<std::string, std::string>& constant);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  void update(const std::vector<MetricSample>& samples);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Whether this ddprun was built with prometheus-cpp.
bool metrics_built_in();

}  // namespace ddp::launcher
