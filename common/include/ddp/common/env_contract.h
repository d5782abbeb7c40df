#pragma once
// The environment contract between the launcher and its workers (torchrun's
// variables plus ddprun's own). This file holds the one writer (to_env) and the
// one parser (from_env) of those variables; nothing else reads them by hand.

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

struct WorkerEnv {
  int rank = 0;              // RANK: global rank
  int local_rank = 0;        // LOCAL_RANK: rank within this node
  int group_rank = 0;        // GROUP_RANK: node rank
  int role_rank = 0;         // ROLE_RANK: rank within the role (one role: == rank)
  int world_size = 1;        // WORLD_SIZE
  int local_world_size = 1;  // LOCAL_WORLD_SIZE
  int group_world_size = 1;  // GROUP_WORLD_SIZE: number of nodes
  int role_world_size = 1;   // ROLE_WORLD_SIZE
  std::string role_name = "default";
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT
  int max_restarts = 0;   // TORCHELASTIC_MAX_RESTARTS
  std::string run_id;     // TORCHELASTIC_RUN_ID and DDP_RUN_ID
  // ddprun's control plane; empty when the job has no rendezvous server.
  std::string rdzv_endpoint;  // DDP_RDZV_ENDPOINT, HOST:PORT
  // DDP_RDZV_UNAVAILABLE: why ddprun could not start the workers' server, so
  // that a worker needing it fails at once saying so (written only when set
  // and rdzv_endpoint is empty).
  std::string rdzv_unavailable;
  std::string rdzv_token;   // DDP_RDZV_TOKEN
  long round = 0;           // DDP_ROUND
  std::string rdzv_tls_ca;  // DDP_RDZV_TLS_CA: PEM CA of a TLS rendezvous (written only when set)
  std::string node_addr;    // DDP_NODE_ADDR: this node's address for peer traffic (multi-node only)
  // DDP_OUTPUT_PREFIXED=1: the launcher starts every console line of this
  // worker with "[rank N] ", so ddp::log leaves the rank out of its own
  // prefix (written only when true; "0" or "1" when read).
  bool output_prefixed = false;
  // TORCHELASTIC_ERROR_FILE: where torch's @record writes this worker's
  // error.json (written only when set; an inherited one is never passed on).
  std::string error_file;
  // TORCH_NCCL_ASYNC_ERROR_HANDLING, as torchrun sets it: the launcher's own
  // value, else "1".
  std::string nccl_async_error_handling = "1";
  // TORCHELASTIC_USE_AGENT_STORE ("True"/"False", always written): whether
  // the launcher serves torch.distributed's store on MASTER_ADDR:MASTER_PORT
  // (the static form of several nodes, as torchrun 2.x), so every rank is a
  // client of it; otherwise the program's rank 0 binds MASTER_PORT itself
  // (an inherited "True" is never passed on: it would make every rank wait
  // for a store nobody serves).
  bool use_agent_store = false;
  // Live recovery (ddprun --on_failure=heal), all three written only when heal is on:
  // DDP_ON_FAILURE=heal tells libddp a dead peer is replaced, not the group
  // restarted; DDP_HEAL_MARK is the file libddp creates once the program has
  // opted into healing (the launcher relaunches only ranks that did);
  // DDP_INCARNATION counts this rank's relaunches in the round (0: first
  // launch; at least 1 on a node that joined the running round), so a
  // relaunched rank joins the live group instead of forming one.
  bool heal = false;
  std::string heal_mark;
  int incarnation = 0;
  // What the launcher sets beside torchrun's variables:
  // DDP_NODE_CPUS (written when > 0): with --bind_cores_to_rank, how many CPUs
  // the node's ranks share (each rank's own mask is only its slice).
  int node_cpus = 0;
  // DDP_PROGRESS_FD (written when >= 0): the progress board libddp counts
  // collectives on (--hang_timeout, ddprun status); inherited by the worker.
  int progress_fd = -1;
  // OMP_NUM_THREADS and PYTHONFAULTHANDLER are the user's: the launcher sets
  // them only when its own environment does not (then written when
  // non-empty; an inherited value reaches the worker as it was): "1" thread
  // per rank with several local ranks, and Python's fault handler (every
  // thread's traceback on SIGABRT) under --hang_timeout.
  std::string omp_num_threads;
  std::string python_fault_handler;
  // CUDA_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES, written only when the
  // launcher chooses the worker's devices, and then in place of an inherited
  // value: the Slurm step's GPUs when the launcher's environment names none,
  // or with --virtual_local_rank the worker's own device alone (HIP's too when
  // the launcher's environment sets HIP_VISIBLE_DEVICES). Otherwise the
  // user's values are inherited as they are.
  std::string cuda_visible_devices;
  std::string hip_visible_devices;

  // The variables to put in a worker's environment, in a stable order.
  std::vector<std::pair<std::string, std::string>> to_env() const;

  // Reads the contract through `getenv` (injectable for tests). Returns
  // nullopt when RANK and WORLD_SIZE are both absent (not launched: a world
  // of one). Throws ddp::Error naming the variable when one is present but
  // malformed or inconsistent (e.g. RANK >= WORLD_SIZE).
  static std::optional<WorkerEnv> from_env(const std::function<const char*(const char*)>& getenv);
  static std::optional<WorkerEnv> from_process_env();
  // DDP_NODE_CPUS alone (0 when unset), read at each call and without the
  // rest of the contract (ddp::node_cpus() works outside a launch too).
  // Throws ddp::Error naming it when it is not a whole number >= 1.
  static int node_cpus_from(const std::function<const char*(const char*)>& getenv);
};

// Names of every variable the contract writes (for tests and docs).
const std::vector<std::string>& contract_variable_names();

// The variable and value that hand a process the GPUs it may use, for a
// launcher that starts a node's agent with a device list of its own (a
// hostfile's per-host devices): {"CUDA_VISIBLE_DEVICES", "0,2"}.
std::pair<std::string, std::string> visible_devices_variable(const std::vector<int>& devices);

}  // namespace ddp
