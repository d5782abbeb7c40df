#include "agent/worker_launches.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "agent/heal_marks.h"
#include "ddp/common/env_contract.h"
#include "ddp/common/error.h"

extern char** environ;

namespace ddp::launcher {
namespace {

int open_log_file(const std::string& path) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("--log_dir: cannot open '" + path + "': " + std::strerror(errno));
  return fd;
}

// --virtual_local_rank: the one device local rank `i` sees, as device 0
// (torchrun's rule: `parent`, the launcher's HIP_VISIBLE_DEVICES, else its
// CUDA_VISIBLE_DEVICES, names the devices; without either, device = local
// rank). `parent_name` names the variable in the error.
std::string own_device(int local_rank, const char* parent, const char* parent_name) {
  if (parent == nullptr) return std::to_string(local_rank);
  std::vector<std::string> devices;
  std::stringstream items(parent);
  for (std::string item; std::getline(items, item, ',');) devices.push_back(item);
  if (static_cast<size_t>(local_rank) >= devices.size()) {
    throw Error("--virtual_local_rank: local rank " + std::to_string(local_rank) +
                " has no device in " + parent_name + "=" + parent);
  }
  return devices[static_cast<size_t>(local_rank)];
}

// The devices local rank `i` sees, when the launcher chooses them.
void choose_devices(const LaunchSpec& spec, int i, WorkerEnv& env) {
  const char* hip = std::getenv("HIP_VISIBLE_DEVICES");
  if (hip != nullptr && *hip == '\0') hip = nullptr;
  const char* cuda = std::getenv("CUDA_VISIBLE_DEVICES");
  // The Slurm step's GPUs (set only when the launcher's environment has none).
  if (cuda == nullptr && !spec.cuda_visible_devices.empty()) {
    env.cuda_visible_devices = spec.cuda_visible_devices;
    cuda = env.cuda_visible_devices.c_str();
  }
  if (!spec.virtual_local_rank) return;
  env.cuda_visible_devices = hip != nullptr ? own_device(i, hip, "HIP_VISIBLE_DEVICES")
                                            : own_device(i, cuda, "CUDA_VISIBLE_DEVICES");
  if (hip != nullptr) env.hip_visible_devices = env.cuda_visible_devices;
}

// The contract's variables for local rank `i`, launched for the
// `incarnation`-th time in the round (0: first).
WorkerEnv worker_env(const LaunchInputs& in, int i, const std::string& rank_dir, int incarnation) {
  const LaunchSpec& spec = in.spec;
  WorkerEnv env;
  env.rank = in.round.global_rank_offset + i;
  env.local_rank = spec.virtual_local_rank ? 0 : i;
  env.group_rank = in.round.group_rank;
  env.role_rank = env.rank;
  env.world_size = in.round.world_size;
  env.local_world_size = spec.nproc_per_node;
  env.group_world_size = in.round.group_world_size;
  env.role_world_size = env.world_size;
  env.role_name = spec.role;
  // The static form passes --master_addr as given, as torchrun does: each
  // node resolves it (a name node 0 maps to 127.0.1.1 must not become
  // node 0's loopback address in every rank).
  env.master_addr = spec.multi_node() && spec.rdzv_backend == RdzvBackend::kStatic
                        ? spec.master_addr
                        : in.round.master_addr;
  env.master_port = in.round.master_port;
  env.use_agent_store = spec.agent_store;
  env.restart_count = in.round.restart_count;
  env.max_restarts = spec.max_restarts;
  env.run_id = spec.run_id;
  env.rdzv_unavailable = in.rdzv_unavailable;
  env.rdzv_endpoint = in.rdzv_endpoint;
  env.rdzv_token = spec.rdzv_token;
  env.round = in.round.round;
  env.output_prefixed = spec.rank_prefix;  // ddp::log then leaves the rank out of its prefix
  env.node_cpus = in.node_cpus;
  env.progress_fd = in.progress_fd;
  env.omp_num_threads = in.omp_num_threads;
  env.python_fault_handler = in.python_fault_handler;
  if (const char* nccl_async = std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING")) {
    env.nccl_async_error_handling = nccl_async;
  }
  env.error_file = RunFiles::error_file(rank_dir);
  choose_devices(spec, i, env);
  if (spec.multi_node()) {
    env.rdzv_tls_ca = spec.tls_ca;
    env.node_addr = in.node_address;
  }
  if (!in.heal_mark_dir.empty()) {
    env.heal = true;
    env.heal_mark = HealMarks::path(in.heal_mark_dir, i);
    env.incarnation = incarnation;
  }
  return env;
}

// Where local rank `i`'s streams go: the console unless redirected (and not
// tee'd) or filtered out; its log file whenever logs are kept. As under
// torchrun, whose workers write to its terminal and share its stdin: a
// terminal for each stream the console shows when ddprun's is one, and
// ddprun's stdin for local rank 0 (breakpoint(), input()).
void route_streams(const LaunchInputs& in, int i, const std::string& rank_dir, bool open_files,
                   WorkerLaunch& launch) {
  const LaunchSpec& spec = in.spec;
  const bool shown = !spec.local_ranks_filter ||
                     std::find(spec.local_ranks_filter->begin(), spec.local_ranks_filter->end(),
                               i) != spec.local_ranks_filter->end();
  for (int s = 0; s < 2; ++s) {
    const int bit = s == 0 ? kStdout : kStderr;
    const bool redirected = (spec.redirects.for_rank(i) & bit) && !(spec.tee.for_rank(i) & bit);
    TeeTarget& target = launch.streams[s];
    target.console_fd = (shown && !redirected) ? (s == 0 ? STDOUT_FILENO : STDERR_FILENO) : -1;
    target.prefix = spec.rank_prefix ? "[rank " + std::to_string(launch.rank) + "] " : "";
    if (in.files.keeps_logs()) {
      target.file_path = rank_dir + (s == 0 ? "/stdout.log" : "/stderr.log");
      if (open_files) target.file_fd = open_log_file(target.file_path);
    }
    target.keep_last_lines = s == 1 ? in.kept_stderr_lines : 0;
  }
  if (i == 0) launch.stdio.stdin_fd = in.rank0_stdin;
  launch.stdio.stdout_tty = launch.streams[0].console_fd >= 0 && isatty(STDOUT_FILENO) == 1;
  launch.stdio.stderr_tty = launch.streams[1].console_fd >= 0 && isatty(STDERR_FILENO) == 1;
}

// Local rank `i`'s launch, filled in place (the caller closes the log files
// opened so far when a later one cannot be).
void fill_launch(const LaunchInputs& in, int i, int incarnation, bool open_files,
                 WorkerLaunch& launch) {
  launch.local_rank = i;
  launch.rank = in.round.global_rank_offset + i;
  launch.cpus = in.cpus[static_cast<size_t>(i)];
  const std::string rank_dir = in.files.worker_dir(in.round.restart_count, i);
  launch.env = in.base_env;
  const auto contract = worker_env(in, i, rank_dir, incarnation).to_env();
  // What the contract writes replaces an inherited value of the same name.
  std::erase_if(launch.env, [&](const std::string& entry) {
    const std::string name = entry.substr(0, entry.find('='));
    return std::any_of(contract.begin(), contract.end(),
                       [&](const auto& variable) { return variable.first == name; });
  });
  for (const auto& [name, value] : contract) launch.env.push_back(name + "=" + value);
  route_streams(in, i, rank_dir, open_files, launch);
}

}  // namespace

std::vector<std::string> base_environment() {
  std::vector<std::string> env;
  const auto& names = contract_variable_names();
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    std::string name = entry.substr(0, entry.find('='));
    bool ours = false;
    for (const auto& n : names) ours = ours || n == name;
    if (!ours) env.push_back(std::move(entry));
  }
  return env;
}

WorkerLaunch worker_relaunch(const LaunchInputs& in, int i, int incarnation) {
  WorkerLaunch launch;
  fill_launch(in, i, incarnation, false, launch);
  return launch;
}

std::vector<WorkerLaunch> worker_launches(const LaunchInputs& in) {
  const int n = in.spec.nproc_per_node;
  std::vector<WorkerLaunch> launches(static_cast<size_t>(n));
  try {
    for (int i = 0; i < n; ++i) {
      fill_launch(in, i, first_incarnation(in.round), true, launches[static_cast<size_t>(i)]);
    }
  } catch (...) {
    // The log files opened so far are closed when a later one cannot be made.
    for (auto& launch : launches) {
      for (auto& target : launch.streams) {
        if (target.file_fd >= 0) close(target.file_fd);
      }
    }
    throw;
  }
  return launches;
}

}  // namespace ddp::launcher
