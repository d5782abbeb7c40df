#pragma once
// Starting and signalling worker processes (Linux).

#include <signal.h>
#include <sys/types.h>

#include <string>
#include <vector>

namespace ddp::launcher {

struct SpawnedProcess {
  pid_t pid = -1;      // also its process group id
  int stdout_fd = -1;  // read ends of the worker's stdout/stderr pipes (non-blocking, cloexec)
  int stderr_fd = -1;
};

// Forks and execs `argv` with exactly `env` ("NAME=value" entries) as its
// environment, stdin from /dev/null and stdout/stderr into fresh pipes. The
// child leads its own process group, gets SIGKILL when ddprun dies
// (PR_SET_PDEATHSIG), and starts with default signal dispositions and an
// empty signal mask. Must be called from the thread that lives as long as
// the worker (the parent-death signal follows the forking thread). Throws
// ddp::Error when pipes or fork fail; an exec failure shows up as exit code
// 127 with the reason on the worker's stderr. A non-empty `cpus` (CPU ids)
// becomes the child's affinity mask before it execs; a mask the kernel
// refuses is reported like an exec failure (exit code 127, the reason on
// the worker's stderr). `inherit_fd`, when not -1, is a close-on-exec
// descriptor the child keeps open across the exec (the progress board).
// ddprun and its children may ptrace the child (PR_SET_PTRACER).
// `stdio` says what the child's standard streams are (default: /dev/null as
// stdin, pipes for stdout and stderr).
struct StdioChoice {
  int stdin_fd = -1;  // duplicated as the child's stdin; -1: /dev/null
  // A pseudo-terminal instead of a pipe (raw: bytes pass unchanged), sized as
  // ddprun's terminal, so that the program's isatty() is true as under
  // torchrun, whose workers write to its terminal. The read end then ends
  // with EIO instead of EOF.
  bool stdout_tty = false;
  bool stderr_tty = false;
};
SpawnedProcess spawn_process(const std::vector<std::string>& argv,
                             const std::vector<std::string>& env, const std::vector<int>& cpus = {},
                             int inherit_fd = -1, const StdioChoice& stdio = {});

// Makes this process the reaper of its orphaned descendants
// (PR_SET_CHILD_SUBREAPER): a daemon a worker starts (setsid and a double
// fork) becomes ddprun's child instead of init's, so it can be stopped with
// the job. Returns false when the kernel refuses.
bool become_subreaper();

// Sends `sig` to every process of the group `pgid` (ESRCH is ignored).
void signal_group(pid_t pgid, int sig);

// Raises this process's soft open-file limit to its hard limit (a server
// that runs out of descriptors stops accepting connections for good), and
// remembers the old one: spawned workers get the limit ddprun was started
// with, as under any other launcher. Call once, before spawning.
void raise_open_file_limit();

// "SIGTERM"-style name of a signal number ("signal 42" when unknown).
std::string signal_name(int sig);

// The signals that ask ddprun to stop (forwarded to the workers, which are
// then stopped). SIGUSR1/SIGUSR2 are forwarded too, as notices: the job goes on.
inline constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// Whether ddprun has been asked to stop (one of kStopSignals is pending).
// ddprun blocks its signals and reads them from a signalfd, so they stay
// pending until read; looking does not consume them.
bool stop_signal_pending();

}  // namespace ddp::launcher
