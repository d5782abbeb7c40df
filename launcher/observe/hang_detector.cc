#include "observe/hang_detector.h"

#include <algorithm>

namespace ddp::launcher {
namespace {

bool in_collective(const RankSample& s) { return s.libddp && s.begun > s.completed; }

bool progressed(const RankSample& before, const RankSample& now) {
  if (now.exited) return true;
  if (now.libddp != before.libddp) return true;  // libddp attached: it has started
  if (now.libddp) {
    if (now.begun != before.begun || now.completed != before.completed) return true;
    if (in_collective(now)) return false;
  }
  return now.cpu_ticks != before.cpu_ticks;
}

std::string doing(const RankSample& s) {
  if (s.exited) return "exited, after " + std::to_string(s.completed) + " collective(s)";
  std::string text = s.stopped ? "stopped (SIGSTOP or a debugger)" : "uses no CPU";
  if (!s.libddp) return s.stopped ? text : "used no CPU time";
  if (!s.stopped && !in_collective(s)) text = "busy or blocked outside libddp";
  if (in_collective(s)) {
    text += ", in " + std::string(progress_op_name(s.op)) + " #" + std::to_string(s.begun);
  } else {
    text += ", between collectives (" + std::to_string(s.completed) + " done)";
  }
  return text;
}

}  // namespace

std::string rank_list(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string text;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!text.empty()) text += ", ";
    if (j - i >= 2) {
      text += std::to_string(ranks[i]) + "-" + std::to_string(ranks[j]);
    } else {
      for (size_t k = i; k <= j; ++k) text += (k > i ? ", " : "") + std::to_string(ranks[k]);
    }
    i = j + 1;
  }
  return text;
}

std::optional<HangVerdict> HangDetector::observe(Clock::time_point now,
                                                 const std::vector<RankSample>& ranks) {
  if (last_.size() != ranks.size()) {
    last_ = ranks;
    last_progress_.assign(ranks.size(), now);
    return std::nullopt;
  }
  HangVerdict verdict;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (progressed(last_[i], ranks[i])) last_progress_[i] = now;
    if (now - last_progress_[i] >= timeout_) verdict.stuck.push_back(static_cast<int>(i));
  }
  last_ = ranks;
  if (verdict.stuck.empty()) return std::nullopt;

  // Who waits for whom: a rank inside its collective #k waits for the local
  // ranks that have not begun their k-th (collectives run in the same order
  // on every rank of a group).
  const int n = static_cast<int>(ranks.size());
  std::vector<std::vector<int>> waiters(
      ranks.size());  // per waited-for rank: the indexes of those waiting
  for (int r = 0; r < n; ++r) {
    if (!in_collective(ranks[r])) continue;
    for (int q = 0; q < n; ++q) {
      if (q != r && ranks[q].libddp && ranks[q].begun < ranks[r].begun) waiters[q].push_back(r);
    }
  }
  for (int q = 0; q < n; ++q) {
    const bool is_stuck =
        std::find(verdict.stuck.begin(), verdict.stuck.end(), q) != verdict.stuck.end();
    if (!waiters[q].empty() || (is_stuck && !in_collective(ranks[q]))) verdict.blamed.push_back(q);
  }
  if (verdict.blamed.empty()) {
    verdict.blamed = verdict.stuck;
    verdict.waits_elsewhere = true;
  }
  for (int q : verdict.blamed) {
    std::string line = "rank " + std::to_string(ranks[q].rank) + ": " + doing(ranks[q]);
    if (!waiters[q].empty()) {
      std::vector<int> global;
      for (int r : waiters[q]) global.push_back(ranks[r].rank);
      const RankSample& first = ranks[waiters[q].front()];
      line += "; rank" + std::string(global.size() > 1 ? "s " : " ") + rank_list(global) + " wait" +
              (global.size() > 1 ? "" : "s") + " for it in " + progress_op_name(first.op) + " #" +
              std::to_string(first.begun);
    }
    verdict.lines.push_back(std::move(line));
  }
  if (verdict.waits_elsewhere) {
    verdict.lines.push_back(
        "every rank on this node began that collective: they wait for a rank on another node, "
        "or the backend is stuck");
  }
  return verdict;
}

}  // namespace ddp::launcher
