#pragma once
// How a worker ended, and the report ddprun prints for the first failure.
// Pure formatting: unit-tested without processes.

#include <deque>
#include <string>
#include <vector>

namespace ddp::launcher {

struct WorkerOutcome {
  int rank = 0;
  int local_rank = 0;
  int pid = 0;
  std::string host;
  bool signaled = false;  // killed by a signal (then `code` is the signal number)
  int code = 0;           // exit code, or signal number when signaled
  bool hung = false;      // stopped by ddprun after no progress for --hang_timeout

  bool failed() const { return hung || signaled || code != 0; }
  // The launcher's exit code for this outcome: 124 for a hang (as timeout(1)
  // exits), else the code, or 128 + signal.
  int launcher_exit_code() const { return hung ? 124 : signaled ? 128 + code : code; }
  // "exit code 3" / "signal SIGSEGV (11)" (+ the out-of-memory hint for SIGKILL).
  std::string describe() const;
};

// The multi-line report naming the first failed rank, its pid, how it ended
// and the last lines of its stderr.
std::string format_failure_report(const WorkerOutcome& failed,
                                  const std::deque<std::string>& last_stderr, int attempt,
                                  int max_restarts);

// Where one rank of a hung group is stuck, for the hang report.
struct StuckRank {
  int rank = 0;
  std::string source;              // "eu-stack", "Python traceback (faulthandler)", ...
  std::vector<std::string> lines;  // its stacks or traceback
};

// The report for a hung group: a headline naming the ranks to blame
// (`blamed`: each one's outcome, for its pid and host), then `what` (one
// line per blamed rank: what it does, who waits for it), then each stuck
// rank's stacks (at most max_lines_each lines each).
std::string format_hang_report(const std::vector<WorkerOutcome>& blamed, double timeout_s,
                               const std::vector<std::string>& what,
                               const std::vector<StuckRank>& stacks, int attempt, int max_restarts,
                               size_t max_lines_each = 40);

}  // namespace ddp::launcher
