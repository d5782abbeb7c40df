#include "worker_group/failure_report.h"

#include <signal.h>

#include <fmt/format.h>

#include <algorithm>

#include "worker_group/process.h"

namespace ddp::launcher {

std::string WorkerOutcome::describe() const {
  if (hung) return "no progress (stopped by ddprun: --hang_timeout)";
  if (!signaled) return "exit code " + std::to_string(code);
  std::string text = "signal " + signal_name(code) + " (" + std::to_string(code) + ")";
  if (code == SIGKILL) {
    text += "; a SIGKILL nobody sent is usually the kernel's out-of-memory killer (check `dmesg`)";
  }
  return text;
}

std::string format_failure_report(const WorkerOutcome& failed,
                                  const std::deque<std::string>& last_stderr, int attempt,
                                  int max_restarts) {
  std::string report = "worker failed: rank " + std::to_string(failed.rank) + " (local rank " +
                       std::to_string(failed.local_rank) + ", pid " + std::to_string(failed.pid);
  if (!failed.host.empty()) report += ", host " + failed.host;
  report += ") ended with " + failed.describe();
  report +=
      " [attempt " + std::to_string(attempt + 1) + " of " + std::to_string(max_restarts + 1) + "]";
  if (last_stderr.empty()) {
    report += "\n  (rank " + std::to_string(failed.rank) + " wrote nothing to stderr)";
  } else {
    report += "\n  last " + std::to_string(last_stderr.size()) + " line(s) of rank " +
              std::to_string(failed.rank) + "'s stderr:";
    for (const auto& line : last_stderr) report += "\n  | " + line;
  }
  return report;
}

std::string format_hang_report(const std::vector<WorkerOutcome>& blamed, double timeout_s,
                               const std::vector<std::string>& what,
                               const std::vector<StuckRank>& stacks, int attempt, int max_restarts,
                               size_t max_lines_each) {
  std::string report = "worker group hung (no progress for " + fmt::format("{:g}", timeout_s) +
                       " s, --hang_timeout): rank";
  if (blamed.size() > 1) report += "s";
  for (size_t i = 0; i < blamed.size(); ++i) {
    const WorkerOutcome& w = blamed[i];
    report += (i > 0 ? ", " : " ") + std::to_string(w.rank) + " (local rank " +
              std::to_string(w.local_rank) + ", pid " + std::to_string(w.pid) +
              (w.host.empty() ? "" : ", host " + w.host) + ")";
  }
  report +=
      " [attempt " + std::to_string(attempt + 1) + " of " + std::to_string(max_restarts + 1) + "]";
  for (const auto& line : what) report += "\n  " + line;
  for (const auto& stuck : stacks) {
    report += "\n  rank " + std::to_string(stuck.rank) + ", " + stuck.source + ":";
    const size_t shown = std::min(stuck.lines.size(), max_lines_each);
    for (size_t i = 0; i < shown; ++i) report += "\n  | " + stuck.lines[i];
    if (shown < stuck.lines.size()) {
      report += "\n  | ... " + std::to_string(stuck.lines.size() - shown) + " more line(s)";
    }
  }
  return report;
}

}  // namespace ddp::launcher
