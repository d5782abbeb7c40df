#pragma once
// LaunchSpec: the launcher's validated view of its command line and config
// file. Parsing is pure (no process is started); every error is a ddp::Error
// whose text names the flag at fault.

#include <optional>
#include <string>
#include <vector>

#include "stream_routing.h"

namespace ddp::launcher {

struct LaunchSpec {
  int nproc_per_node = 1;
  std::string nproc_per_node_text = "1";  // as given (N, auto, cpu, gpu)
  int nnodes = 1;
  int node_rank = 0;
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
