#pragma once
// How a worker ended, and the report ddprun prints for the first failure.
// Pure formatting: unit-tested without processes.

#include <deque>
#include <string>

namespace ddp::launcher {

struct WorkerOutcome {
  int rank = 0;
  int local_rank = 0;
  int pid = 0;
  std::string host;
  bool signaled = false;  // killed by a signal (then `code` is the signal number)
  int code = 0;           // exit code, or signal number when signaled

  bool failed() const { return signaled || code != 0; }
  // The launcher's exit code for this outcome: the code, or 128 + signal.
  int launcher_exit_code() const { return signaled ? 128 + code : code; }
  // "exit code 3" / "signal SIGSEGV (11)" (+ the out-of-memory hint for SIGKILL).
  std::string describe() const;
};

// The multi-line report naming the first failed rank, its pid, how it ended
// and the last lines of its stderr.
std::string format_failure_report(const WorkerOutcome& failed, const std::deque<std::string>& last_stderr,
                                  int attempt, int max_restarts);

}  // namespace ddp::launcher
