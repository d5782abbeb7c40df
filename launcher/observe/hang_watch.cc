#include "observe/hang_watch.h"

#include <signal.h>

#include <algorithm>

#include "ddp/common/launcher_log.h"
#include "worker_group/process.h"
#include "worker_group/process_probe.h"

namespace ddp::launcher {
namespace {

// Ranks whose stacks a report shows, and the time each stack tool gets.
constexpr size_t kMaxStackedRanks = 8;
constexpr auto kStackToolTime = std::chrono::seconds(5);
// How long aborted Python ranks get to write their tracebacks.
constexpr auto kTracebackTime = std::chrono::seconds(3);

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
}

// The faulthandler dump at the end of a rank's stderr ("Fatal Python error:"
// and the tracebacks after it), or nothing.
std::vector<std::string> python_traceback(const std::deque<std::string>& lines) {
  for (size_t i = lines.size(); i-- > 0;) {
    if (lines[i].rfind("Fatal Python error", 0) == 0)
      return {lines.begin() + static_cast<long>(i), lines.end()};
  }
  return {};
}

}  // namespace

HangWatch::HangWatch(double timeout_s, const ProgressBoard& board, bool python, bool spare_waiters)
    : timeout_s_(timeout_s),
      board_(board),
      python_(python),
      spare_waiters_(spare_waiters),
      detector_(to_ms(timeout_s)),
      // Every tenth of the timeout, 50 ms to 1 s.
      sample_every_(std::clamp(to_ms(timeout_s / 10), std::chrono::milliseconds(50),
                               std::chrono::milliseconds(1000))),
      next_sample_(Clock::now() + sample_every_) {}

HangWatch::Clock::time_point HangWatch::next_wake() const {
  if (!dump_) return next_sample_;
  return dump_->done ? Clock::time_point::max() : dump_->deadline;
}

bool HangWatch::tick(WorkerGroup& group) {
  if (dump_) {
    if (dump_->done) return false;
    bool dumped = true;
    for (size_t i : dump_->aborted) dumped = dumped && !group[i].running;
    if (!dumped && Clock::now() < dump_->deadline && !stop_signal_pending()) return false;
    finish_dump(group);
    return true;
  }
  if (Clock::now() < next_sample_) return false;
  next_sample_ = Clock::now() + sample_every_;
  if (auto verdict = detector_.observe(Clock::now(), sample(group))) {
    begin_dump(group, std::move(*verdict));
    return tick(group);  // no Python rank to wait for: the report is ready now
  }
  return false;
}

std::vector<RankSample> HangWatch::sample(const WorkerGroup& group) const {
  std::vector<pid_t> pids;
  for (size_t i = 0; i < group.size(); ++i) pids.push_back(group[i].pid);
  std::vector<GroupUsage> usage = process_group_usage(pids);
  std::vector<RankSample> samples(group.size());
  for (size_t i = 0; i < group.size(); ++i) {
    RankSample& s = samples[i];
    const ProgressSlot& slot = board_.slot(static_cast<int>(i));
    s.rank = group[i].rank;
    s.exited = !group[i].running;
    s.libddp = slot.attached.load(std::memory_order_relaxed) != 0;
    // completed before begun: both only grow, so begun >= completed.
    s.completed = slot.completed.load(std::memory_order_acquire);
    s.begun = slot.begun.load(std::memory_order_acquire);
    s.op = static_cast<ProgressOp>(slot.op.load(std::memory_order_relaxed));
    s.cpu_ticks = usage[i].cpu_ticks;
    s.stopped = usage[i].leader_stopped;
  }
  return samples;
}

void HangWatch::begin_dump(WorkerGroup& group, HangVerdict verdict) {
  launcher_log().warn(
      "no progress for {:g} s (--hang_timeout): collecting where the ranks are stuck", timeout_s_);
  std::vector<int> shown = verdict.blamed;
  for (int i : verdict.stuck) {
    if (python_ && spare_waiters_) break;  // SIGABRT would end them
    if (std::find(shown.begin(), shown.end(), i) == shown.end()) shown.push_back(i);
  }
  if (shown.size() > kMaxStackedRanks) shown.resize(kMaxStackedRanks);
  Dump dump{std::move(verdict), {}, {}, Clock::now() + kTracebackTime};
  for (int index : shown) {
    const auto i = static_cast<size_t>(index);
    const Worker& w = group[i];
    if (!w.running) continue;
    if (python_) {
      // SIGCONT too: a stopped rank runs its handler.
      kill(w.pid, SIGABRT);
      kill(w.pid, SIGCONT);
      dump.aborted.push_back(i);
    } else {
      dump.stacks.push_back({w.rank, "native stacks", native_stacks(w.pid, kStackToolTime)});
    }
  }
  dump_ = std::move(dump);
}

void HangWatch::finish_dump(WorkerGroup& group) {
  for (size_t i : dump_->aborted) {
    group.pump_all(i);
    auto lines = python_traceback(group[i].tees[1]->last_lines());
    if (lines.empty())
      lines = {"(no traceback: the rank did not answer SIGABRT with a faulthandler dump)"};
    dump_->stacks.push_back({group[i].rank, "Python traceback (faulthandler)", std::move(lines)});
  }
  // The blamed ranks' stacks first, then the others', each by rank.
  const std::vector<int>& blamed = dump_->verdict.blamed;
  auto is_blamed = [&](int rank) {
    return std::any_of(blamed.begin(), blamed.end(),
                       [&](int i) { return group[static_cast<size_t>(i)].rank == rank; });
  };
  std::sort(dump_->stacks.begin(), dump_->stacks.end(),
            [&](const StuckRank& a, const StuckRank& b) {
              return std::pair(!is_blamed(a.rank), a.rank) < std::pair(!is_blamed(b.rank), b.rank);
            });
  dump_->done = true;
}

std::vector<WorkerOutcome> HangWatch::blamed(const WorkerGroup& group) const {
  std::vector<WorkerOutcome> outcomes;
  for (int i : dump_->verdict.blamed) {
    WorkerOutcome o = group[static_cast<size_t>(i)].outcome;
    o.hung = true;
    outcomes.push_back(o);
  }
  return outcomes;
}

std::string HangWatch::report(const WorkerGroup& group, int attempt, int max_restarts) const {
  return format_hang_report(blamed(group), timeout_s_, dump_->verdict.lines, dump_->stacks, attempt,
                            max_restarts);
}

}  // namespace ddp::launcher
