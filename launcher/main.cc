// ddprun: entry point. Parses the command line into a LaunchSpec, then runs
// the node agent. Every error is one line naming what is wrong, exit code 2
// for bad input, and nothing is started.

#include <malloc.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "agent/agent.h"
#include "agent/rpc_plugin.h"
#include "cli/launch_spec.h"
#include "ddp/common/error.h"
#include "ddp/common/launcher_log.h"
#include "frontend/front_end.h"
#include "frontend/remote_gate.h"
#include "worker_group/orphan_guard.h"
#include "worker_group/process.h"

namespace {

// `ddprun health` and `ddprun status`: read-only questions to a rendezvous.
int query_command(const std::vector<std::string>& args) {
  try {
    if (args[1] == "status") return ddp::launcher::load_rpc_plugin().status_command(args);
    return ddp::launcher::load_rpc_plugin().health_command(args);
  } catch (const ddp::Error& e) {
    ddp::launcher_log().error("error: {}", e.what());
    return 1;
  }
}

// Signals are read from a signalfd in the agent's poll loop, so they are
// blocked before any child (guard or worker) exists; children unblock them.
// Writing to a closed console or a dead guard must not kill the supervisor.
// Returns the signalfd, or -1.
int block_signals() {
  signal(SIGPIPE, SIG_IGN);
  sigset_t handled = ddp::launcher::forwarded_signals();
  sigaddset(&handled, SIGCHLD);
  sigprocmask(SIG_BLOCK, &handled, nullptr);
  return signalfd(-1, &handled, SFD_NONBLOCK | SFD_CLOEXEC);
}

// The rendezvous server reads a request whole before it can check its token
// (docs/security.md). By default glibc keeps freed memory in one arena per
// server thread (up to eight per core) and raises its mmap threshold to the
// largest block freed, so a flood of 8 MiB requests left ddprun holding
// 380-570 MiB it no longer used. Two arenas and a fixed threshold give large
// buffers back to the system when they are freed (the same flood: ~160 MiB).
// Only ddprun is affected: the workers are exec'd with glibc's defaults.
void bound_allocator_retention() {
  mallopt(M_ARENA_MAX, 2);
  mallopt(M_MMAP_THRESHOLD, 256 << 10);
}

}  // namespace

int main(int argc, char** argv) {
  bound_allocator_retention();
  ddp::launcher::raise_open_file_limit();
  using namespace ddp::launcher;
  std::vector<std::string> args(argv, argv + argc);
  // Subcommands come first; any other first word is a program to launch.
  if (args.size() >= 2 && (args[1] == "health" || args[1] == "status")) return query_command(args);
  ParseOutcome parsed;
  const bool daemon = args.size() >= 2 && args[1] == "rendezvous";
  // One host's agent of a `ddprun --hostfile` job, started by the front end over ssh.
  double remote_gate_s = 0;
  if (args.size() >= 2 && args[1].rfind("--remote_agent=", 0) == 0) {
    remote_gate_s = std::atof(args[1].c_str() + std::strlen("--remote_agent="));
    args.erase(args.begin() + 1);
  }
  std::optional<FrontEndArgs> front;  // --hostfile / --hosts: this ddprun is the front end
  try {
    if (!daemon && remote_gate_s <= 0) front = parse_front_end_args(args);
    if (!daemon && !front) parsed = parse_launch_args(args);
  } catch (const ddp::Error& e) {
    ddp::launcher_log().error("error: {}", e.what());
    return 2;
  }
  if (!daemon && !front && !parsed.spec) {
    std::fputs(parsed.message.c_str(), stdout);
    return parsed.exit_code;
  }
  if (!daemon && !front) {
    for (const auto& notice : parsed.spec->notices) ddp::launcher_log().info("{}", notice);
  }

  const int signal_fd = block_signals();
  if (signal_fd < 0) {
    ddp::launcher_log().error("error: signalfd failed");
    return 1;
  }
  int code = 1;
  try {
    if (daemon) return load_rpc_plugin().rendezvous_command(args, signal_fd);
    if (front) {
      try {
        code = run_front_end(*front, signal_fd);
      } catch (const ddp::Error& e) {  // bad input (a hostfile, .ddp_env): nothing was started
        ddp::launcher_log().error("error: {}", e.what());
        code = 2;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    }
    RemoteGate gate;
    if (remote_gate_s > 0) {
      if (int left = gate.open(*parsed.spec, remote_gate_s, signal_fd); left != 0) _exit(left);
    }
    // Daemons the workers start outside their process groups become ddprun's
    // children, so they end with the job (WorkerGroup::drain).
    if (!become_subreaper()) ddp::launcher_log().debug("PR_SET_CHILD_SUBREAPER refused");
    OrphanGuard guard(parsed.spec->run_id);  // forked while ddprun is single-threaded
    if (remote_gate_s > 0) gate.watch();     // a thread: after the guard's fork
    Agent agent(*parsed.spec, guard, signal_fd);
    if (remote_gate_s > 0) agent.on_front_end_lost(&RemoteGate::front_end_lost);
    code = agent.run();
    // Leave without destructors: the workers' rendezvous server may still be
    // loading on its thread (it has nothing to save), and waiting for it would
    // cost a single-node job ~15 ms. Closing the guard's pipe happens at exit.
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(code);
  } catch (const ddp::Error& e) {
    ddp::launcher_log().error("error: {}", e.what());
    std::fflush(stderr);
    _exit(code);
  }
}
