#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>

#include "core/init_parts.h"
#include "ddp/common/env_contract.h"
#include "ddp/common/error.h"
#include "ddp/common/grpc_logging.h"
#include "ddp/common/rendezvous_client.h"
#include "ddp/ddp.h"

namespace ddp {
namespace {

std::mutex g_mu;
std::shared_ptr<ProcessGroup> g_group;

const std::optional<WorkerEnv>& contract() {
  static const std::optional<WorkerEnv> env = WorkerEnv::from_process_env();
  return env;
}

bool gpu_visible() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible != nullptr) return *visible != '\0' && *visible != '-';
  struct stat st {};
  return stat("/dev/nvidia0", &st) == 0;
}

// "auto" (the default): NCCL when a GPU is visible, else cpu_backend().
std::string choose_backend(const InitOptions& options) {
  std::string chosen = options.backend;
  if (chosen.empty()) {
    const char* b = std::getenv("DDP_BACKEND");
    chosen = b != nullptr && *b != '\0' ? b : "auto";
    if (chosen != "auto" && chosen != "shm" && chosen != "gloo" && chosen != "nccl" &&
        chosen != "local") {
      throw Error("environment variable DDP_BACKEND='" + chosen +
                  "' is not one of auto, shm, gloo, nccl, local");
    }
  }
  if (chosen != "auto") return chosen;
  return gpu_visible() ? "nccl" : cpu_backend();
}

// The backend was named rather than left to auto.
bool backend_named(const InitOptions& options) {
  if (!options.backend.empty()) return options.backend != "auto";
  const char* b = std::getenv("DDP_BACKEND");
  return b != nullptr && *b != '\0' && std::string(b) != "auto";
}

std::chrono::milliseconds choose_timeout(const InitOptions& options) {
  if (options.timeout.count() > 0) return options.timeout;
  if (const char* t = std::getenv("DDP_TIMEOUT_S"); t != nullptr && *t != '\0') {
    char* end = nullptr;
    double seconds = std::strtod(t, &end);
    if (end == t || *end != '\0' || !(seconds > 0)) {
      throw Error("environment variable DDP_TIMEOUT_S='" + std::string(t) +
                  "' is not a positive number");
    }
    return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
  }
  return std::chrono::minutes(5);
}

}  // namespace

namespace detail {

const std::optional<WorkerEnv>& worker_env() { return contract(); }

ProcessGroupOptions group_options(const std::string& name, const InitOptions& options) {
  const auto& env = contract();
  ProcessGroupOptions pg;
  pg.backend = choose_backend(options);
  pg.timeout = choose_timeout(options);
  pg.shm_algorithm = options.shm_algorithm;
  const char* debug = std::getenv("DDP_DEBUG");
  pg.debug_checks = debug != nullptr && std::string(debug) == "1";
  pg.group_name = name;
  if (!env || env->world_size == 1) {
    // A world of one needs no communication: the local backend, unless nccl
    // was named (InitOptions::backend or DDP_BACKEND, not auto), which gets a
    // NCCL communicator of one on device LOCAL_RANK, as torch's
    // init_process_group("nccl") does: a one-GPU run takes the many-GPU path.
    if (pg.backend != "nccl" || !backend_named(options)) pg.backend = "local";
    pg.device = env ? env->local_rank : 0;
    return pg;
  }
  pg.device = env->local_rank;
  pg.local_rank = env->local_rank;
  pg.local_size = env->local_world_size;
  pg.node = env->group_rank;
  pg.nodes = env->group_world_size;
  pg.run_id = env->run_id;
  pg.round = env->round;
  // Single node: loopback, independent of DNS. Several nodes: the address the agent advertised.
  if (!env->node_addr.empty()) pg.host = env->node_addr;
  return pg;
}

std::shared_ptr<Store> job_store() {
  const auto& env = contract();
  if (env->rdzv_endpoint.empty() && !env->rdzv_unavailable.empty()) {
    throw Error("ddprun could not start the workers' rendezvous server, which libddp needs: " +
                env->rdzv_unavailable);
  }
  if (env->rdzv_endpoint.empty()) {
    throw Error(
        "DDP_RDZV_ENDPOINT is not set: libddp needs ddprun's rendezvous (launch with ddprun)");
  }
  route_grpc_logs();
  // One connection for every live group; it goes with the last group that
  // holds it, as the default group's always did, never at exit.
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  static std::weak_ptr<Store> shared;
  std::shared_ptr<Store> rendezvous = shared.lock();
  if (!rendezvous) {
    rendezvous = make_grpc_store(std::make_shared<RendezvousClient>(
        env->rdzv_endpoint, env->run_id, env->rdzv_token, TlsFiles{"", "", env->rdzv_tls_ca}));
    shared = rendezvous;
  }
  return rendezvous;
}

}  // namespace detail

namespace {

// A group over every rank of the job, named `name` (its keys: run id,
// round and name, so a restarted round never reads the previous round's
// addresses; for shm, its segment).
std::shared_ptr<ProcessGroup> make_group(const std::string& name, const InitOptions& options) {
  const auto& env = contract();
  const ProcessGroupOptions pg = detail::group_options(name, options);
  if (!env || env->world_size == 1)
    return ProcessGroup::create(env ? env->rank : 0, 1, nullptr, pg);
  auto store = make_prefix_store(detail::job_store(), "pg/" + env->run_id + "/round" +
                                                          std::to_string(env->round) + "/" + name);
  return ProcessGroup::create(env->rank, env->world_size, store, pg);
}

}  // namespace

std::shared_ptr<ProcessGroup> init(const InitOptions& options) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_group) g_group = make_group("default", options);
  return g_group;
}

std::shared_ptr<ProcessGroup> new_group(const std::string& name, const InitOptions& options) {
  const bool well_formed =
      !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
      });
  if (!well_formed || name == "default") {
    throw Error(
        "ddp::new_group: name '" + name +
        "' must be 1-64 letters, digits, '-' or '_', and not 'default' (the group of ddp::init())");
  }
  std::lock_guard<std::mutex> lock(g_mu);
  return make_group(name, options);
}

void shutdown() {
  std::shared_ptr<ProcessGroup> group;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    group = std::move(g_group);
  }
  group.reset();
}

ProcessGroup& default_group() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_group) throw Error("ddp::init() has not been called");
  return *g_group;
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_group != nullptr;
}

int rank() { return contract() ? contract()->rank : 0; }
int world_size() { return contract() ? contract()->world_size : 1; }
int local_rank() { return contract() ? contract()->local_rank : 0; }
int local_world_size() { return contract() ? contract()->local_world_size : 1; }
int num_nodes() { return contract() ? contract()->group_world_size : 1; }

// From job-wide facts, so every rank picks the same backend even when nodes differ in size.
std::string cpu_backend() { return world_size() > num_nodes() ? "shm" : "gloo"; }
bool is_distributed() { return world_size() > 1; }

}  // namespace ddp
