#include "worker_group/process.h"

#include <fcntl.h>
#include <pty.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "ddp/common/error.h"

namespace ddp::launcher {
namespace {

// Child side of spawn_process: async-signal-safe calls only.
[[noreturn]] void fail_child(const char* what, const char* name) {
  const char* reason = strerror(errno);
  const char* parts[] = {"ddprun: cannot ", what, " '", name, "': ", reason, "\n"};
  for (const char* part : parts) {
    ssize_t ignored = write(STDERR_FILENO, part, strlen(part));
    (void)ignored;
  }
  _exit(127);
}

// The open-file limit ddprun was started with (see raise_open_file_limit).
rlimit g_started_nofile{};
bool g_raised_nofile = false;

[[noreturn]] void exec_child(pid_t parent, char* const* argv, char* const* envp, int out_w,
                             int err_w, const cpu_set_t* cpus, int inherit_fd, int stdin_fd) {
  setpgid(0, 0);
  if (inherit_fd >= 0) fcntl(inherit_fd, F_SETFD, 0);  // survives the exec
  // Where Yama restricts ptrace to ancestors, let ddprun and its children
  // (eu-stack, gdb) read the worker's stacks for a hang report.
  prctl(PR_SET_PTRACER, parent, 0, 0, 0);
  if (g_raised_nofile) setrlimit(RLIMIT_NOFILE, &g_started_nofile);
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  if (getppid() != parent) _exit(127);  // ddprun already died between fork and prctl
  for (int sig = 1; sig < NSIG; ++sig) signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (stdin_fd < 0) {
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
  } else if (stdin_fd != STDIN_FILENO) {
    dup2(stdin_fd, STDIN_FILENO);
  }
  dup2(out_w, STDOUT_FILENO);
  dup2(err_w, STDERR_FILENO);
  if (cpus != nullptr && sched_setaffinity(0, sizeof *cpus, cpus) != 0) {
    fail_child("bind to its CPUs (--bind_cores_to_rank)", argv[0]);
  }
  execvpe(argv[0], argv, envp);
  fail_child("execute", argv[0]);
}

// A pipe, or a raw pseudo-terminal sized as ddprun's `like_fd` terminal:
// ends[0] is read by ddprun, ends[1] becomes the child's stream. Both close-on-exec.
void open_stream(int ends[2], bool tty, int like_fd) {
  if (!tty) {
    if (pipe2(ends, O_CLOEXEC) != 0) throw Error(std::string("pipe: ") + strerror(errno));
    return;
  }
  termios raw{};
  cfmakeraw(&raw);  // no output processing: "\n" stays "\n", bytes pass unchanged
  winsize size{};
  const bool sized = ioctl(like_fd, TIOCGWINSZ, &size) == 0;
  if (openpty(&ends[0], &ends[1], nullptr, &raw, sized ? &size : nullptr) != 0) {
    throw Error(std::string("openpty: ") + strerror(errno));
  }
  fcntl(ends[0], F_SETFD, FD_CLOEXEC);
  fcntl(ends[1], F_SETFD, FD_CLOEXEC);
}

}  // namespace

void raise_open_file_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  g_started_nofile = limit;
  limit.rlim_cur = limit.rlim_max;
  g_raised_nofile = setrlimit(RLIMIT_NOFILE, &limit) == 0;
}

SpawnedProcess spawn_process(const std::vector<std::string>& argv,
                             const std::vector<std::string>& env, const std::vector<int>& cpus,
                             int inherit_fd, const StdioChoice& stdio) {
  if (argv.empty()) throw Error("spawn_process: empty command");
  cpu_set_t cpu_set;
  CPU_ZERO(&cpu_set);
  for (int cpu : cpus) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) throw Error("spawn_process: CPU " + std::to_string(cpu));
    CPU_SET(cpu, &cpu_set);
  }
  // Everything the child needs is built before fork: no allocation after it.
  std::vector<char*> c_argv, c_env;
  for (const auto& a : argv) c_argv.push_back(const_cast<char*>(a.c_str()));
  c_argv.push_back(nullptr);
  for (const auto& e : env) c_env.push_back(const_cast<char*>(e.c_str()));
  c_env.push_back(nullptr);

  int out[2], err[2];
  open_stream(out, stdio.stdout_tty, STDOUT_FILENO);
  try {
    open_stream(err, stdio.stderr_tty, STDERR_FILENO);
  } catch (...) {
    close(out[0]);
    close(out[1]);
    throw;
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
    throw Error(std::string("fork: ") + strerror(e));
  }
  if (pid == 0) {
    exec_child(parent, c_argv.data(), c_env.data(), out[1], err[1],
               cpus.empty() ? nullptr : &cpu_set, inherit_fd, stdio.stdin_fd);
  }
  // Also set the group from the parent so signal_group works before the child runs.
  setpgid(pid, pid);
  close(out[1]);
  close(err[1]);
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  return {pid, out[0], err[0]};
}

bool stop_signal_pending() {
  sigset_t pending;
  if (sigpending(&pending) != 0) return false;
  for (int sig : kStopSignals) {
    if (sigismember(&pending, sig) == 1) return true;
  }
  return false;
}

bool become_subreaper() { return prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0; }

void signal_group(pid_t pgid, int sig) {
  if (pgid > 0) kill(-pgid, sig);
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

}  // namespace ddp::launcher
