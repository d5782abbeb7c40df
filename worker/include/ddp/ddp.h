#pragma once
// libddp's entry point: ddp::init() turns the environment ddprun (or torchrun)
// gave the process into a ProcessGroup, also reachable as the process-wide
// default group. Without the launcher's variables the process is a world of
// one (rank 0, size 1) and every collective is a local no-op, unless the
// backend is named nccl (InitOptions::backend or DDP_BACKEND, not auto): a
// world of one then gets a NCCL communicator of one on device LOCAL_RANK,
// as torch's init_process_group("nccl") does, so one GPU runs the path many take.

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "ddp/process_group.h"
#include "ddp/store.h"
#include "ddp/types.h"
#include "ddp/work.h"

namespace ddp {

struct InitOptions {
  // "" = DDP_BACKEND, else "auto": "nccl" when a GPU is visible, else "shm"
  // when some node runs several ranks (WORLD_SIZE > GROUP_WORLD_SIZE: shared
  // memory within nodes, Gloo across them), else "gloo".
  std::string backend;
  // Per-collective timeout; 0 = DDP_TIMEOUT_S, else 300 s.
  std::chrono::milliseconds timeout{0};
  // For shm: the algorithm variants (ProcessGroupOptions::shm_algorithm);
  // "" = DDP_SHM_ALGO, else each timed.
  std::string shm_algorithm;
};

// Reads the environment contract (common/'s parser), connects to the
// rendezvous (DDP_RDZV_ENDPOINT; a world launched by plain torchrun without it
// is refused with an error naming the variable), and creates the group with
// keys scoped by run id, round and group. Calling init() twice returns the
// existing group. Throws ddp::Error naming what is wrong.
std::shared_ptr<ProcessGroup> init(const InitOptions& options = {});
// Collective over every rank (each calls it with the same name, in the same
// order): another group over the default group's ranks, with keys and a
// shared-memory segment of its own, made from the environment as init()
// makes the default group, with `options` (backend, timeout, shm variants)
// applied the same way; what the group does never touches the default
// one's collectives. `name`: letters, digits, '-' and '_', not "default".
// A world of one gets a local group (a NCCL one when nccl is named, as for
// init()). Throws ddp::Error naming what is wrong.
std::shared_ptr<ProcessGroup> new_group(const std::string& name, const InitOptions& options = {});
// Destroys the default group (waits for issued collectives). Idempotent.
void shutdown();
// The group made by init(); throws ddp::Error when init() was not called.
ProcessGroup& default_group();
bool is_initialized();

// From the environment contract (valid before init(): a world of one without it).
int rank();
int world_size();
int local_rank();
int local_world_size();
// GROUP_WORLD_SIZE: the number of nodes (1 when not launched).
int num_nodes();
// The CPU backend "auto" picks: "shm" when some node runs several ranks
// (WORLD_SIZE > GROUP_WORLD_SIZE; shared memory within nodes, Gloo across
// them), else "gloo". The same on every rank.
std::string cpu_backend();
bool is_distributed();  // world_size() > 1

// How many CPUs the ranks of this node share: the number ddprun
// --bind_cores_to_rank split among them (DDP_NODE_CPUS: each rank's own mask
// is then only its slice), else this process's affinity mask (taskset, a
// cgroup cpuset), else the online CPUs; at least 1. Not
// std::thread::hardware_concurrency(), which counts the machine's. libddp's
// waits spin only while the node's ranks are no more than this (a rank
// spinning on a core that the rank it waits for needs costs milliseconds);
// code with waits of its own can decide the same way. Throws ddp::Error
// naming DDP_NODE_CPUS when it is set but not a whole number >= 1.
int node_cpus();

}  // namespace ddp
