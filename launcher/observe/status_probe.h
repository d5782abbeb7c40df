#pragma once
// StatusProbe: samples what ddprun status and the metrics show of this
// node's workers, from the worker group (pids, exits, output times), the
// progress board (collectives) and /proc (CPU time, RSS, stopped). Driven
// by the agent's event loop about once a second; not thread-safe.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "ddp/common/progress_board.h"
#include "observe/job_status.h"
#include "worker_group/worker_group.h"

namespace ddp::launcher {

class StatusProbe {
 public:
  using Clock = std::chrono::steady_clock;
  // `node`: the node's fields (rank, host, round, restarts...); its ranks are
  // replaced by the sample.
  NodeStatus sample(const NodeStatus& node, const WorkerGroup& group, const ProgressBoard* board);
  // Each rank's arrivals at that sample (read_arrivals), in the ranks'
  // order: nullopt for a rank without (no board, no libddp, exited).
  const std::vector<std::optional<ArrivalMark>>& arrivals() const { return arrivals_; }

 private:
  struct Seen {
    Clock::time_point started;  // when this pid was first seen
    std::uint64_t ticks = 0;    // CPU ticks at the previous sample
    Clock::time_point at;       // time of the previous sample
  };
  std::map<pid_t, Seen> seen_;
  std::vector<std::optional<ArrivalMark>> arrivals_;
};

// The resident set of `pid` in bytes (0 when it is gone).
std::uint64_t resident_bytes(pid_t pid);

}  // namespace ddp::launcher
