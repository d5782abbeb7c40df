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
// The guard is forked while ddprun is still single-threaded, and after the
// fork it makes only async-signal-safe calls and never allocates.
//
// Not thread-safe: use from the launcher's main thread.

#include <sys/types.h>

#include <string>

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

 private:
  void send(int value);
  int write_fd_ = -1;
  pid_t guard_pid_ = -1;
};

}  // namespace ddp::launcher
