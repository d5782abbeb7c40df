#pragma once
// The node agent: runs the worker group of one node through its attempts.
// One attempt = spawn every worker, supervise (output, exits, signals), stop
// the group when one fails or a signal arrives (SIGTERM, grace period,
// SIGKILL of each worker's process group), and restart as a new attempt while
// --max_restarts allows. Single-threaded: everything happens in one poll loop
// on the workers' pipes and a signalfd.

#include <signal.h>

#include "launch_spec.h"
#include "orphan_guard.h"

namespace ddp::launcher {

// Signals ddprun forwards to its workers (and so blocks for its signalfd).
sigset_t forwarded_signals();

class Agent {
 public:
  // `signal_fd`: a signalfd for SIGCHLD + forwarded_signals(), which the
  // caller has blocked. Neither is owned.
  Agent(const LaunchSpec& spec, OrphanGuard& guard, int signal_fd)
      : spec_(spec), guard_(guard), signal_fd_(signal_fd) {}

  // Runs the job; returns ddprun's exit code (0, the failed worker's code,
  // or 128 + signal). Throws ddp::Error when nothing could be started.
  int run();

 private:
  struct AttemptResult;
  AttemptResult run_attempt(int attempt, int master_port);

  const LaunchSpec& spec_;
  OrphanGuard& guard_;
  int signal_fd_;
};

}  // namespace ddp::launcher
