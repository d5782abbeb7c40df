#pragma once
// What each local worker of an attempt is started with: its environment
// (ddprun's own, without stale contract variables, plus the contract's
// variables written by WorkerEnv), its CPUs, where its output goes (console,
// log files), its stdin and whether its streams are terminals.

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "agent/run_files.h"
#include "cli/launch_spec.h"
#include "ddp/common/rendezvous_types.h"
#include "worker_group/worker_group.h"

namespace ddp::launcher {

// ddprun's environment minus the contract's variables (a job started from
// inside another job must not inherit stale ranks): what every worker's
// environment starts from.
std::vector<std::string> base_environment();

struct LaunchInputs {
  LaunchInputs(const LaunchSpec& s, const RunFiles& f, RoundAssignment r)
      : spec(s), files(f), round(std::move(r)) {}
  const LaunchSpec& spec;
  const RunFiles& files;
  RoundAssignment round;
  std::string rdzv_endpoint;           // the workers' rendezvous server ("" when unavailable)
  std::string rdzv_unavailable;        // why there is none, for libddp to say
  std::string node_address;            // this node's advertised address (several nodes)
  int rank0_stdin = -1;                // local rank 0's stdin; -1: /dev/null
  std::vector<std::string> base_env;   // "NAME=value" without the contract's variables
  std::vector<std::vector<int>> cpus;  // per local rank; empty: inherited
  std::size_t kept_stderr_lines = 0;   // for the failure or hang report
  std::string heal_mark_dir;           // --on_failure=heal: the run's HealMarks ("": off)
  // The contract's launcher settings (WorkerEnv's node_cpus, progress_fd,
  // omp_num_threads, python_fault_handler), the same for every rank.
  int node_cpus = 0;
  int progress_fd = -1;
  std::string omp_num_threads;
  std::string python_fault_handler;
};

// The incarnation (DDP_INCARNATION) of the round's first launches: 1 on a
// node admitted into a running round (--on_failure=heal), whose workers
// join the live ranks as relaunches do; else 0.
inline int first_incarnation(const RoundAssignment& round) { return round.joined_running ? 1 : 0; }

// One launch per local rank. Opens the per-worker log files (closed again
// when a later one fails). Throws ddp::Error naming --log_dir, or
// --virtual_local_rank when a rank has no device.
std::vector<WorkerLaunch> worker_launches(const LaunchInputs& in);

// --on_failure=heal: local rank `i`'s launch for its relaunch number
// `incarnation` (DDP_INCARNATION), otherwise as at first; no log file is
// opened (the running tees keep the rank's).
WorkerLaunch worker_relaunch(const LaunchInputs& in, int i, int incarnation);

}  // namespace ddp::launcher
