#pragma once
// LaunchSpec: the launcher's validated view of its command line and config
// file. Parsing is pure (no process is started); every error is a ddp::Error
// whose text names the flag at fault.

#include <optional>
#include <string>
#include <vector>

#include "cli/rdzv_conf.h"
#include "cli/stream_routing.h"

namespace ddp::launcher {

// --rdzv_backend: both are served by ddprun's gRPC rendezvous; the name only
// says how its host is found. kStatic: node rank 0 hosts it and every node
// gives --node_rank. kC10d: the node whose address matches the endpoint's
// host hosts it (or rdzv_conf is_host), and node ranks are assigned (a
// --node_rank given anyway is kept). Without --rdzv_backend: static when
// --node_rank is given and --nnodes is fixed, else c10d.
enum class RdzvBackend { kStatic, kC10d };

// --on_failure: what a failed worker leads to. kRestart: the group is stopped
// (and restarted while --max_restarts allow). kHeal (live recovery, single
// node): a failed rank whose program opted into libddp's healing is relaunched
// alone, each relaunch spending one of --max_restarts, while the other ranks
// go on; a rank that did not opt in is handled as with kRestart.
enum class OnFailure { kRestart, kHeal };

struct LaunchSpec {
  int nproc_per_node = 1;
  std::string nproc_per_node_text = "1";  // as given (N, auto, cpu, gpu)
  int min_nodes = 1;                      // --nnodes=MIN:MAX (both equal for a fixed size)
  int nnodes = 1;                         // MAX
  int node_rank = -1;                     // -1: assigned by the rendezvous (0 on a single node)
  RdzvBackend rdzv_backend = RdzvBackend::kStatic;
  bool multi_node() const { return nnodes > 1; }
  // This agent must run the rendezvous server in-process: a single node, the
  // static form's node rank 0, or a c10d node told so by is_host=1.
  bool hosts_rendezvous() const {
    if (!multi_node()) return true;
    if (rdzv_backend == RdzvBackend::kStatic) return node_rank == 0;
    return rdzv_conf.is_host.value_or(false);
  }
  // A c10d node without is_host: it hosts the rendezvous when the endpoint's
  // host is one of its own addresses, else (or when another agent on this
  // machine already listens there) it is a client, like torchrun.
  bool guesses_host() const {
    return multi_node() && rdzv_backend == RdzvBackend::kC10d && !rdzv_conf.is_host.has_value();
  }

  // The static form's agent store, as torchrun 2.x: the rendezvous listens
  // on MASTER_ADDR:MASTER_PORT itself and also serves torch.distributed's
  // TCPStore there (node rank 0 hosts both), so the job needs one port and
  // workers get TORCHELASTIC_USE_AGENT_STORE=True. Set for the static form of
  // several nodes (Slurm's included) without --rdzv_endpoint and without TLS
  // (--rdzv_tls_*: gRPC's TLS acceptor cannot share its port; the rendezvous
  // then listens on MASTER_PORT+1 and the program's rank 0 binds MASTER_PORT).
  bool agent_store = false;

  // Rendezvous. Single-node jobs default to 127.0.0.1 on a free port.
  std::string rdzv_endpoint;  // HOST:PORT as given ("" = default)
  std::string rdzv_host;      // parsed
  int rdzv_port = 0;
  std::string rdzv_token;  // --rdzv_token / DDP_RDZV_TOKEN; generated for single-node jobs;
                           // empty: a multi-node job without authentication
  RdzvConf rdzv_conf;
  std::string local_addr;  // advertised to peers ("" = the address that routes to the endpoint)
  std::string tls_cert, tls_key, tls_ca;

  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: ddprun reserves a free port
  bool standalone = false;
  int max_restarts = 0;
  OnFailure on_failure = OnFailure::kRestart;
  double monitor_interval_s = 0.1;
  // A rank without progress for this long is reported as hung, with where it
  // is stuck, and the group is stopped (and restarted if restarts remain).
  // 0: off. See hang_detector.h for what counts as progress.
  double hang_timeout_s = 0;
  // torchrun's default; TORCH_ELASTIC_SHUTDOWN_TIMEOUT when the flag is not given.
  double shutdown_timeout_s = 30.0;
  // --virtual_local_rank: LOCAL_RANK=0 in every worker, which sees only its
  // own device (CUDA_VISIBLE_DEVICES, and HIP_VISIBLE_DEVICES when set).
  bool virtual_local_rank = false;
  // Observability (docs/observability.md): Prometheus metrics port (0: off),
  // the JSON-lines event log (empty: none), and how often the workers' state
  // is sampled for ddprun status and the metrics (0: never).
  int metrics_port = 0;
  std::string events_file;
  double status_interval_s = 1.0;
  // Stragglers (observe/straggler_detector.h): the seconds of samples a rank is
  // judged over (0: not judged).
  double straggler_window_s = 40.0;
  std::string log_dir;             // empty: no per-rank files
  bool log_dir_defaulted = false;  // --redirects/--tee without --log_dir chose a temp dir
  StreamMap redirects;
  StreamMap tee;
  std::optional<std::vector<int>> local_ranks_filter;  // nullopt: every rank
  std::string run_id;
  std::string role = "default";
  bool no_python = false;
  bool module = false;
  bool rank_prefix = true;
  // --bind_cores_to_rank: each local rank runs on its own slice of ddprun's
  // CPUs (cpu_binding.h); off: workers inherit ddprun's affinity.
  bool bind_cores_to_rank = false;
  // Interpreter for Python programs and -m: DDP_PYTHON, else PYTHON_EXEC
  // (torchrun's), else python3 from PATH.
  std::string python = "python3";
  // The variable `python` came from ("DDP_PYTHON", "PYTHON_EXEC"; empty: the default).
  std::string python_source;
  // The program is a Python script: it ends in .py, or (torchrun runs every
  // program under Python) it is a file that is neither a binary nor a script
  // with a #! line, such as an extension-less script or a .pyz archive.
  bool python_program = false;

  // One line each for accepted torchrun flags that change nothing here, and
  // for what was taken from a Slurm job step.
  std::vector<std::string> notices;
  // The Slurm step's GPUs (SLURM_STEP_GPUS), for workers to see as
  // CUDA_VISIBLE_DEVICES when it is unset ("": leave the environment alone).
  std::string cuda_visible_devices;

  std::string program;                    // as given
  std::vector<std::string> program_args;  // passed untouched
  // What is exec'd for each worker (interpreter + program + args).
  std::vector<std::string> command() const;
  bool runs_under_python() const;
};

// What parse_launch_args decided: either a spec to run, or text to print and
// an exit code (help, version).
struct ParseOutcome {
  std::optional<LaunchSpec> spec;
  std::string message;
  int exit_code = 0;
};

// Parses argv (argv[0] is the program name) with CLI11, including
// `--config FILE` (TOML) and PET_<FLAG> environment fallbacks. Precedence:
// command line > environment > config file > default. Throws ddp::Error.
// `check_program` resolves the program on PATH (disable in pure unit tests).
ParseOutcome parse_launch_args(const std::vector<std::string>& argv, bool check_program = true);

// --nnodes N or MIN:MAX (positive integers, MIN <= MAX), for the launcher and
// the standalone server alike. Throws ddp::Error naming --nnodes.
struct NodeRange {
  int min = 1, max = 1;
};
NodeRange parse_nnodes(const std::string& text);

// Resolves --nproc_per_node text: a positive integer, or auto|cpu|gpu|xpu
// (auto: GPUs, else XPUs, else CPUs; accelerators.h counts them).
int resolve_nproc(const std::string& text, int visible_gpus, int usable_cpus, int visible_xpus = 0);

// Whether `path` (a file) runs under Python: a .py name, or contents that are
// neither an executable binary (ELF) nor a #! script. A file that cannot be
// read is judged by its name.
bool is_python_program(const std::string& path);
// CPUs in this process's affinity mask.
int count_usable_cpus();

}  // namespace ddp::launcher
