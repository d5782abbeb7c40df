#pragma once
// Which process this is, in a form other ranks can compare (internal):
// "<boot id>/<pid namespace> <pid>". Two ranks whose identities agree up to
// the space see each other's pids (same kernel, same PID namespace), so one
// may check whether the other's process still exists.

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <optional>
#include <string>

#include "ddp/common/proc_stat.h"

namespace ddp::detail {

inline std::string process_identity() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  char ns[128] = {};
  ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
  if (boot.empty() || n <= 0) return "unknown " + std::to_string(getpid());
  return boot + "/" + std::string(ns, static_cast<std::size_t>(n)) + " " + std::to_string(getpid());
}

// The part before the pid: equal for two processes that see each other's pids
// ("unknown" matches nothing).
inline std::string pid_namespace_of(const std::string& identity) {
  std::string ns = identity.substr(0, identity.rfind(' '));
  return ns == "unknown" ? std::string() : ns;
}

// The pid in `identity`, as its own PID namespace numbers it; -1 when it has none.
inline long pid_in(const std::string& identity) {
  try {
    return std::stol(identity.substr(identity.rfind(' ') + 1));
  } catch (const std::exception&) {
    return -1;
  }
}

// The pid in `identity` when this process can check it (same kernel and PID
// namespace as `here`, this process's pid_namespace_of), else nullopt.
inline std::optional<pid_t> checkable_pid(const std::string& identity, const std::string& here) {
  if (here.empty() || pid_namespace_of(identity) != here) return std::nullopt;
  return static_cast<pid_t>(std::stoi(identity.substr(identity.rfind(' ') + 1)));
}

// A process this one can see (checkable_pid), asked whether it is gone:
// through a pidfd where the kernel has them (readable once the process
// exits; a poll, and immune to pid reuse), else process_exited. Open it
// while the process is known alive.
class ProcessWatch {
 public:
  explicit ProcessWatch(pid_t pid)
      : pid_(pid), fd_(static_cast<int>(syscall(SYS_pidfd_open, pid, 0))) {}
  ~ProcessWatch() {
    if (fd_ >= 0) close(fd_);
  }
  ProcessWatch(const ProcessWatch&) = delete;
  ProcessWatch& operator=(const ProcessWatch&) = delete;

  pid_t pid() const { return pid_; }
  bool gone() const {
    if (fd_ < 0) return process_exited(pid_);
    pollfd p{fd_, POLLIN, 0};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
  }

 private:
  pid_t pid_;
  int fd_;  // -1: no pidfd (an old kernel, or the process was already gone)
};

}  // namespace ddp::detail
