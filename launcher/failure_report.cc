#include "failure_report.h"

#include <signal.h>

#include "process.h"

namespace ddp::launcher {

std::string WorkerOutcome::describe() const {
  if (!signaled) return "exit code " + std::to_string(code);
  std::string text = "signal " + signal_name(code) + " (" + std::to_string(code) + ")";
  if (code == SIGKILL) {
    text += "; a SIGKILL nobody sent is usually the kernel's out-of-memory killer (check `dmesg`)";
  }
  return text;
}

std::string format_failure_report(const WorkerOutcome& failed, const std::deque<std::string>& last_stderr,
                                   int attempt, int max_restarts) {
  std::string report = "worker failed: rank " + std::to_string(failed.rank) + " (local rank " +
                       std::to_string(failed.local_rank) + ", pid " + std::to_string(failed.pid);
  if (!failed.host.empty()) report += ", host " + failed.host;
  report += ") ended with " + failed.describe();
  report += " [attempt " + std::to_string(attempt + 1) + " of " + std::to_string(max_restarts + 1) + "]";
  if (last_stderr.empty()) {
    report += "\n  (rank " + std::to_string(failed.rank) + " wrote nothing to stderr)";
  } else {
    report += "\n  last " + std::to_string(last_stderr.size()) + " line(s) of rank " +
              std::to_string(failed.rank) + "'s stderr:";
    for (const auto& line : last_stderr) report += "\n  | " + line;
  }
  return report;
}

}  // namespace ddp::launcher
