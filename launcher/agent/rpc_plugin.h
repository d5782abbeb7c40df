#pragma once
// The launcher's gRPC half lives in libddprun_rpc.so, loaded with dlopen only
// when needed, because loading gRPC's ~60 shared libraries costs ~15 ms: a
// single-node job starts its workers first and loads the plugin on a thread
// while they start. Both sides are built from this tree with one compiler, so
// the interface is plain C++.

#include <memory>
#include <string>
#include <vector>

#include "agent/control_plane.h"
#include "cli/launch_spec.h"

namespace ddp::launcher {

// A rendezvous server for this node's workers (store, barriers); stops when destroyed.
class WorkerRendezvous {
 public:
  virtual ~WorkerRendezvous() = default;
  // The node's status for the server's Status call (ddprun status).
  virtual void publish(const NodeStatus& node) { (void)node; }
};

class RpcPlugin {
 public:
  virtual ~RpcPlugin() = default;
  // Multi-node: hosts the server when spec.hosts_rendezvous(), then connects.
  virtual std::unique_ptr<ControlPlane> multi_node_control_plane(const LaunchSpec& spec) = 0;
  // Single node: serves the workers on 127.0.0.1:`port` (a port ddprun reserved
  // with SO_REUSEADDR, so gRPC's own SO_REUSEADDR bind takes it over).
  virtual std::unique_ptr<WorkerRendezvous> serve_workers(const LaunchSpec& spec, int port) = 0;
  virtual int rendezvous_command(const std::vector<std::string>& argv, int signal_fd) = 0;
  virtual int health_command(const std::vector<std::string>& argv) = 0;
  virtual int status_command(const std::vector<std::string>& argv) = 0;
};

// Loads libddprun_rpc.so from beside the ddprun executable (or $DDPRUN_RPC_PLUGIN).
// Thread-safe; loads once. Throws ddp::Error naming the path and dlerror().
RpcPlugin& load_rpc_plugin();
// Why load_rpc_plugin() will fail, found without loading it (a stat of the
// path: microseconds, where loading gRPC costs ~15 ms): the plugin's path and
// what is wrong with it, or an empty string when it is there to be loaded.
std::string rpc_plugin_missing();

}  // namespace ddp::launcher

// The plugin's entry point (extern "C" to have an unmangled name for dlsym).
extern "C" ddp::launcher::RpcPlugin* ddprun_rpc_plugin();
