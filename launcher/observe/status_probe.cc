#include "observe/status_probe.h"

#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "worker_group/process_probe.h"

namespace ddp::launcher {

std::uint64_t resident_bytes(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/statm";
  FILE* f = std::fopen(path.c_str(), "re");
  if (f == nullptr) return 0;
  unsigned long long size = 0, resident = 0;
  const int got = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  if (got != 2) return 0;
  return resident * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
}

namespace {

std::uint64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

// The rank's steps and their time (a board of an older ddprun has none).
void read_steps(const StepSlot* slot, RankStatus& r) {
  if (slot == nullptr) return;
  r.steps = slot->steps.load(std::memory_order_acquire);
  r.step_median_s = static_cast<double>(slot->median_ns.load(std::memory_order_relaxed)) / 1e9;
  r.step_p99_s = static_cast<double>(slot->p99_ns.load(std::memory_order_relaxed)) / 1e9;
}

// The board's view of one rank: its collectives, and the one it is in.
void read_slot(const ProgressSlot& slot, RankObservation& o, RankStatus& r) {
  o.attached = slot.attached.load(std::memory_order_relaxed) != 0;
  o.completed = slot.completed.load(std::memory_order_acquire);
  o.begun = slot.begun.load(std::memory_order_acquire);
  r.libddp = o.attached;
  r.collectives_done = o.completed;
  r.collective_wait_s = static_cast<double>(slot.wait_ns.load(std::memory_order_relaxed)) / 1e9;
  if (o.begun > o.completed) {
    r.collective_op = progress_op_name(static_cast<ProgressOp>(slot.op.load()));
    r.collective_seq = o.begun;
    const std::uint64_t began = slot.begun_ns.load(std::memory_order_relaxed);
    const std::uint64_t now = monotonic_ns();
    r.in_collective_s = began != 0 && now > began ? static_cast<double>(now - began) / 1e9 : 0;
  }
}

}  // namespace

NodeStatus StatusProbe::sample(const NodeStatus& node, const WorkerGroup& group,
                               const ProgressBoard* board) {
  const auto now = Clock::now();
  NodeStatus out = node;
  out.ranks.clear();
  std::vector<pid_t> pgids;
  for (size_t i = 0; i < group.size(); ++i) pgids.push_back(group[i].pid);
  const std::vector<GroupUsage> usage = process_group_usage(pgids);
  const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
  std::map<pid_t, Seen> next;
  arrivals_.assign(group.size(), std::nullopt);
  for (size_t i = 0; i < group.size(); ++i) {
    const Worker& w = group[i];
    RankStatus r;
    r.rank = w.rank;
    r.local_rank = w.local_rank;
    r.pid = w.pid;
    auto it = seen_.find(w.pid);
    Seen seen = it != seen_.end() ? it->second : Seen{now, usage[i].cpu_ticks, now};
    RankObservation o;
    o.running = w.running;
    o.exited = !w.running;
    o.stopped = w.running && usage[i].leader_stopped;
    o.since_start_s = std::chrono::duration<double>(now - seen.started).count();
    if (board != nullptr && static_cast<int>(i) < board->slots()) {
      read_slot(board->slot(static_cast<int>(i)), o, r);
      read_steps(board->step_slot(static_cast<int>(i)), r);
      if (w.running && o.attached) arrivals_[i] = read_arrivals(board->slot(static_cast<int>(i)));
    }
    Clock::time_point last{};
    for (const auto& tee : w.tees) {
      if (tee && tee->last_output() > last) last = tee->last_output();
    }
    r.last_output_age_s =
        last == Clock::time_point{} ? -1 : std::chrono::duration<double>(now - last).count();
    r.state = classify_rank(o, last != Clock::time_point{});
    if (r.state == RankState::kExited) {
      r.exit_signal = w.outcome.signaled ? w.outcome.code : 0;
      r.exit_code = w.outcome.launcher_exit_code();
    } else {
      const double dt = std::chrono::duration<double>(now - seen.at).count();
      const auto ticks = usage[i].cpu_ticks;
      if (dt > 0.05 && ticks >= seen.ticks) {
        r.cpu_percent = 100.0 * static_cast<double>(ticks - seen.ticks) / hz / dt;
      }
      r.rss_bytes = resident_bytes(w.pid);
      seen.ticks = ticks;
      seen.at = now;
    }
    next[w.pid] = seen;
    out.ranks.push_back(std::move(r));
  }
  seen_ = std::move(next);
  return out;
}

}  // namespace ddp::launcher
