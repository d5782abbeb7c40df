#pragma once
// OrphanGuard: a tiny helper process forked by ddprun before anything else.
// ddprun tells it (over a pipe) which worker process groups exist; when the
// pipe reaches end-of-file — ddprun exited, crashed or was SIGKILLed — the
// guard SIGKILLs every process group still on its list, so no worker nor any
// of its children outlives ddprun. PR_SET_PDEATHSIG on each worker covers the
// worker itself; the guard covers its descendants. Then (once no process of the
// killed groups runs, waiting at most ~2 s) it removes the run's POSIX shared-memory
// segments (/dev/shm/ddp-<run>-*, see ddp/common/shm_names.h), which workers
// killed mid-setup would otherwise leave behind.
//
// Daemons a worker started (setsid and a double fork) leave its process
// group, and once ddprun is gone nobody adopts them for us. Every worker's
// environment therefore carries this guard's tag (kTagVariable, a list of
// tags separated by ':' when ddprun runs under another ddprun), which their
// descendants inherit: when ddprun goes, the guard also SIGKILLs every
// process whose environment holds its tag (scanning /proc until none is
// left, ~2 s at most). A process that scrubs its environment escapes.
//
// The guard is forked while ddprun is still single-threaded, and after the
// fork it makes only async-signal-safe calls and never allocates. When it is
// killed (a stray `kill`), ddprun notices on its next supervision pass and
// forks another with the same tag and the groups watched so far (that fork
// closes every inherited descriptor but its pipe, since ddprun then has
// threads and sockets).
//
// Not thread-safe: use from the launcher's main thread.

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace ddp::launcher {

class OrphanGuard {
 public:
  // Forks the guard for the run `run_id` (whose shared-memory segments it
  // removes when ddprun goes). Throws ddp::Error when fork or pipe fails.
  explicit OrphanGuard(const std::string& run_id);
  ~OrphanGuard();  // closes the pipe and reaps the guard
  OrphanGuard(const OrphanGuard&) = delete;
  OrphanGuard& operator=(const OrphanGuard&) = delete;

  void watch(pid_t pgid);   // kill this group if ddprun dies
  void forget(pid_t pgid);  // the group is gone; do not kill the id later
  pid_t pid() const { return guard_pid_; }

  // When the guard process has ended (it was killed): forks another, as
  // above, and returns a line saying so; nullopt while it runs. One
  // waitpid(WNOHANG). Throws ddp::Error when the fork or pipe fails.
  std::optional<std::string> replace_if_gone();

  // The variable that carries tags in workers' environments.
  static constexpr const char* kTagVariable = "DDP_AGENT_TAGS";
  // "NAME=VALUE" for a worker's environment `env`: this guard's tag after
  // the tags `env` already carries (an outer ddprun's).
  std::string tag_entry(const std::vector<std::string>& env) const;

 private:
  void start();  // the pipe and the fork
  void send(int value);
  std::string tag_;         // 16 hex digits, random
  std::string shm_prefix_;  // the run's segment names, built before any fork
  std::vector<pid_t> watched_;
  int write_fd_ = -1;
  pid_t guard_pid_ = -1;
};

}  // namespace ddp::launcher
