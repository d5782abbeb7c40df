#pragma once
// LaunchSpec: the launcher's validated view of its command line and config
// file. Parsing is pure (no process is started); every error is a ddp::Error
// whose text names the flag at fault.

#include <optional>
#include <string>
#include <vector>

#include "stream_routing.h"

namespace ddp::launcher {

// --rdzv_conf key=value,...: durations in seconds, limits in bytes or counts.
struct RdzvConf {
  double join_timeout_s = 600;
  double last_call_timeout_s = 30;  // torchrun's default
  double heartbeat_interval_s = 1;
  double heartbeat_timeout_s = 10;
  long long max_key_bytes = 4096;
  long long max_value_bytes = 4 << 20;
  long long max_keys = 100000;
  long long max_message_bytes = 8 << 20;  // gRPC messages the server accepts
};

// Throws ddp::Error naming --rdzv_conf and the key when malformed or unknown.
RdzvConf parse_rdzv_conf(const std::string& text);

struct LaunchSpec {
  int nproc_per_node = 1;
  std::string nproc_per_node_text = "1";  // as given (N, auto, cpu, gpu)
  int min_nodes = 1;  // --nnodes=MIN:MAX (both equal for a fixed size)
  int nnodes = 1;     // MAX
  int node_rank = -1;  // -1: assigned by the rendezvous (0 on a single node)
  bool multi_node() const { return nnodes > 1; }
  // This agent runs the rendezvous server in-process: single node, or node rank 0.
  bool hosts_rendezvous() const { return !multi_node() || node_rank == 0; }

  // Rendezvous. Single-node jobs default to 127.0.0.1 on a free port.
  std::string rdzv_endpoint;  // HOST:PORT as given ("" = default)
  std::string rdzv_host;      // parsed
  int rdzv_port = 0;
  std::string rdzv_token;     // --rdzv_token / DDP_RDZV_TOKEN; generated for single-node jobs
  RdzvConf rdzv_conf;
  std::string local_addr;     // advertised to peers ("" = the address that routes to the endpoint)
  std::string tls_cert, tls_key, tls_ca;

  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: ddprun reserves a free port
  bool standalone = false;
  int max_restarts = 0;
  double monitor_interval_s = 0.1;
  double shutdown_timeout_s = 5.0;
  std::string log_dir;  // empty: no per-rank files
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
  std::string python = "python3";  // interpreter for .py programs and -m

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

// Resolves --nproc_per_node text: a positive integer, or auto|cpu|gpu.
int resolve_nproc(const std::string& text, int visible_gpus, int usable_cpus);

// GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else /dev/nvidiaN.
int count_visible_gpus();
// CPUs in this process's affinity mask.
int count_usable_cpus();

}  // namespace ddp::launcher
