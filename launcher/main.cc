// ddprun: entry point. Parses the command line into a LaunchSpec, then runs
// the node agent. Every error is one line naming what is wrong, exit code 2
// for bad input, and nothing is started.

#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "agent.h"
#include "ddp/common/error.h"
#include "ddp/common/grpc_logging.h"
#include "ddp/common/log.h"
#include "launch_spec.h"
#include "orphan_guard.h"
#include "subcommands.h"

int main(int argc, char** argv) {
  using namespace ddp::launcher;
  std::vector<std::string> args(argv, argv + argc);
  ddp::route_grpc_logs();
  // Subcommands come first; any other first word is a program to launch.
  if (args.size() >= 2 && args[1] == "health") return run_health_command(args);
  ParseOutcome parsed;
  const bool daemon = args.size() >= 2 && args[1] == "rendezvous";
  try {
    if (!daemon) parsed = parse_launch_args(args);
  } catch (const ddp::Error& e) {
    ddp::launcher_log().error("error: {}", e.what());
    return 2;
  }
  if (!daemon && !parsed.spec) {
    std::fputs(parsed.message.c_str(), stdout);
    return parsed.exit_code;
  }

  // Writing to a closed console or a dead guard must not kill the supervisor.
  signal(SIGPIPE, SIG_IGN);
  // Signals are read from a signalfd in the agent's poll loop, so they are
  // blocked before any child (guard or worker) exists; children unblock them.
  sigset_t handled = forwarded_signals();
  sigaddset(&handled, SIGCHLD);
  sigprocmask(SIG_BLOCK, &handled, nullptr);
  int signal_fd = signalfd(-1, &handled, SFD_NONBLOCK | SFD_CLOEXEC);
  if (signal_fd < 0) {
    ddp::launcher_log().error("error: signalfd failed");
    return 1;
  }
  if (daemon) return run_rendezvous_command(args, signal_fd);
  try {
    OrphanGuard guard;
    Agent agent(*parsed.spec, guard, signal_fd);
    return agent.run();
  } catch (const ddp::Error& e) {
    ddp::launcher_log().error("error: {}", e.what());
    return 1;
  }
}
