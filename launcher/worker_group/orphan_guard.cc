#include "worker_group/orphan_guard.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "ddp/common/error.h"
#include "ddp/common/proc_stat.h"
#include "ddp/common/shm_names.h"
#include "worker_group/process.h"

namespace ddp::launcher {
namespace {

constexpr int kMaxGroups = 4096;

// Whether /proc/<pid>/stat (`pid` as its decimal name, relative to `proc`)
// shows a process that is still running (not a zombie) in one of `groups`.
bool running_in(int proc, const char* pid, const pid_t* groups, int count) {
  char stat[512];
  const char* p = read_proc_stat(proc, pid, stat);          // gone meanwhile: nullptr
  if (p == nullptr || proc_state_exited(*p)) return false;  // dead: creates nothing more
  p += 1;
  for (int field = 0; field < 2; ++field) {  // skip " ppid", then parse " pgrp"
    if (*p != ' ') return false;
    ++p;
    if (field == 0) {
      while (*p >= '0' && *p <= '9') ++p;
    }
  }
  long pgrp = 0;
  while (*p >= '0' && *p <= '9') pgrp = pgrp * 10 + (*p++ - '0');
  for (int i = 0; i < count; ++i) {
    if (groups[i] == pgrp) return true;
  }
  return false;
}

// Calls `visit(proc, name)` for every process in /proc (`proc`: the open
// /proc, `name`: the pid in decimal) until it returns true; says whether one
// did. Lists /proc with getdents64 (opendir allocates); says false when /proc
// cannot be read.
template <typename Visit>
bool any_process(Visit visit) {
  int proc = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (proc < 0) return false;
  alignas(alignof(struct dirent64)) char buf[8192];
  bool stopped = false;
  while (!stopped) {
    ssize_t n = getdents64(proc, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t off = 0; off < n && !stopped;) {
      const auto* entry = reinterpret_cast<const struct dirent64*>(buf + off);
      if (entry->d_name[0] >= '1' && entry->d_name[0] <= '9') stopped = visit(proc, entry->d_name);
      if (entry->d_reclen == 0) break;
      off += entry->d_reclen;
    }
  }
  close(proc);
  return stopped;
}

// True while a process of one of `groups` still runs. Zombies do not count:
// they can create no segment, and their new parent may be slow to reap them.
bool any_group_running(const pid_t* groups, int count) {
  if (count == 0) return false;
  return any_process(
      [&](int proc, const char* name) { return running_in(proc, name, groups, count); });
}

// Whether the environment of process `pid` (its decimal name, relative to
// `proc`) holds OrphanGuard::kTagVariable with `tag` among its values.
bool carries_tag(int proc, const char* pid, const char* tag, size_t tag_len) {
  char path[40];
  const size_t len = std::strlen(pid);
  if (len > 20) return false;
  std::memcpy(path, pid, len);
  std::memcpy(path + len, "/environ", 9);
  int fd = openat(proc, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // gone, or another user's
  static char env[65536];    // the guard is single-threaded
  size_t have = 0;
  for (ssize_t n; have < sizeof(env) && (n = read(fd, env + have, sizeof(env) - have)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    have += static_cast<size_t>(n);
  }
  close(fd);
  const size_t name_len = std::strlen(OrphanGuard::kTagVariable);
  for (size_t at = 0; at < have;) {
    size_t end = at;
    while (end < have && env[end] != '\0') ++end;
    if (end - at > name_len && std::memcmp(env + at, OrphanGuard::kTagVariable, name_len) == 0 &&
        env[at + name_len] == '=') {
      for (size_t v = at + name_len + 1; v < end;) {  // ':'-separated tags
        size_t e = v;
        while (e < end && env[e] != ':') ++e;
        if (e - v == tag_len && std::memcmp(env + v, tag, tag_len) == 0) return true;
        v = e + 1;
      }
    }
    at = end + 1;
  }
  return false;
}

// SIGKILLs every process whose environment carries `tag`; returns how many.
int kill_tagged(const char* tag) {
  const size_t tag_len = std::strlen(tag);
  int found = 0;
  any_process([&](int proc, const char* name) {
    if (!carries_tag(proc, name, tag, tag_len)) return false;
    long pid = 0;
    for (const char* p = name; *p >= '0' && *p <= '9'; ++p) pid = pid * 10 + (*p - '0');
    if (pid > 1 && pid != getpid() && kill(static_cast<pid_t>(pid), SIGKILL) == 0) ++found;
    return false;  // every process is looked at
  });
  return found;
}

// Runs in the forked guard: only async-signal-safe calls, no allocation.
// `shm_prefix`: the run's segment-name prefix, built before the fork.
[[noreturn]] void guard_main(int read_fd, const char* shm_prefix, const char* tag) {
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
  // The daemons they left outside their groups: until a scan finds none (a
  // daemon may fork while the scan runs), ~2 s at most.
  for (int tick = 0; tick < 200 && kill_tagged(tag) > 0; ++tick) {
    timespec ten_ms{0, 10 * 1000 * 1000};
    nanosleep(&ten_ms, nullptr);
  }
  // A worker inside shm_open when SIGKILL came may still finish creating its
  // segment: sweep once every killed process has died (bounded: ~2 s).
  for (int tick = 0; tick < 200 && any_group_running(groups, count); ++tick) {
    timespec ten_ms{0, 10 * 1000 * 1000};
    nanosleep(&ten_ms, nullptr);
  }
  remove_segments_with_prefix("/dev/shm", shm_prefix);
  _exit(0);
}

}  // namespace

OrphanGuard::OrphanGuard(const std::string& run_id) : shm_prefix_(shm_run_prefix(run_id)) {
  std::random_device random;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%08x%08x", random(), random());
  tag_ = hex;
  start();
}

void OrphanGuard::start() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0)
    throw Error(std::string("orphan guard: pipe: ") + std::strerror(errno));
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    throw Error(std::string("orphan guard: fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    // Only the pipe's read end: a copy of its write end, of a socket or of
    // another pipe's write end would keep it open after ddprun is gone.
    close(fds[1]);
    const int read_fd = fds[0] == 3 ? 3 : dup2(fds[0], 3);
    close_range(4, ~0U, 0);
    guard_main(read_fd, shm_prefix_.c_str(), tag_.c_str());
  }
  close(fds[0]);
  write_fd_ = fds[1];
  guard_pid_ = pid;
}

std::optional<std::string> OrphanGuard::replace_if_gone() {
  int status = 0;
  if (guard_pid_ <= 0 || waitpid(guard_pid_, &status, WNOHANG) != guard_pid_) return std::nullopt;
  const pid_t was = guard_pid_;
  close(write_fd_);
  write_fd_ = -1;
  guard_pid_ = -1;
  start();
  for (pid_t group : watched_) send(static_cast<int>(group));
  const std::string how = WIFSIGNALED(status)
                              ? "was killed by " + signal_name(WTERMSIG(status))
                              : "exited with code " + std::to_string(WEXITSTATUS(status));
  return "ddprun's orphan guard (pid " + std::to_string(was) + ") " + how +
         "; started another (pid " + std::to_string(guard_pid_) + ")";
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

std::string OrphanGuard::tag_entry(const std::vector<std::string>& env) const {
  const std::string name = std::string(kTagVariable) + "=";
  for (const auto& entry : env) {
    if (entry.rfind(name, 0) == 0 && entry.size() > name.size()) return entry + ":" + tag_;
  }
  return name + tag_;
}

void OrphanGuard::watch(pid_t pgid) {
  watched_.push_back(pgid);
  send(static_cast<int>(pgid));
}

void OrphanGuard::forget(pid_t pgid) {
  std::erase(watched_, pgid);
  send(-static_cast<int>(pgid));
}

}  // namespace ddp::launcher
