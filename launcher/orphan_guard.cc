#include "orphan_guard.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "ddp/common/error.h"

namespace ddp::launcher {
namespace {

constexpr int kMaxGroups = 4096;

// Runs in the forked guard: only async-signal-safe calls, no allocation.
[[noreturn]] void guard_main(int read_fd) {
  // Signals aimed at ddprun's terminal process group must not stop the guard.
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE, SIGTSTP}) {
    signal(sig, SIG_IGN);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  prctl(PR_SET_NAME, "ddprun-guard", 0, 0, 0);

  static pid_t groups[kMaxGroups];
  int count = 0;
  int value = 0;
  size_t have = 0;
  for (;;) {
    ssize_t n = read(read_fd, reinterpret_cast<char*>(&value) + have, sizeof(value) - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: ddprun is gone (or done)
    have += static_cast<size_t>(n);
    if (have < sizeof(value)) continue;
    have = 0;
    if (value > 0) {
      if (count < kMaxGroups) groups[count++] = value;
    } else {
      for (int i = 0; i < count; ++i) {
        if (groups[i] == -value) {
          groups[i] = groups[--count];
          break;
        }
      }
    }
  }
  for (int i = 0; i < count; ++i) kill(-groups[i], SIGKILL);
  _exit(0);
}

}  // namespace

OrphanGuard::OrphanGuard() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw Error(std::string("orphan guard: pipe: ") + std::strerror(errno));
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    throw Error(std::string("orphan guard: fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    close(fds[1]);
    guard_main(fds[0]);
  }
  close(fds[0]);
  write_fd_ = fds[1];
  guard_pid_ = pid;
}

OrphanGuard::~OrphanGuard() {
  if (write_fd_ >= 0) close(write_fd_);
  if (guard_pid_ > 0) {
    while (waitpid(guard_pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
}

void OrphanGuard::send(int value) {
  const char* p = reinterpret_cast<const char*>(&value);
  size_t left = sizeof(value);
  while (left > 0) {
    ssize_t n = write(write_fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // guard gone: nothing more we can do
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void OrphanGuard::watch(pid_t pgid) { send(static_cast<int>(pgid)); }
void OrphanGuard::forget(pid_t pgid) { send(-static_cast<int>(pgid)); }

}  // namespace ddp::launcher
