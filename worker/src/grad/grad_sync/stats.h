#pragma once
// Statistics of GradSync and SharedGradSum (internal): the latest
// iteration's figures, the sums over synced iterations that stats() turns
// into means, and when rank 0 logs an iteration. Guarded by the owner's mutex.

#include <cstdint>

#include "ddp/grad_averager.h"

namespace ddp::detail {

class StatsBook {
 public:
  // Numbers `s` (the next iteration), keeps it as the latest, and adds it to
  // the sums when synced. Returns it numbered.
  const IterationStats& record(IterationStats s);
  std::uint64_t iterations() const { return iterations_; }
  std::uint64_t synced_iterations() const { return synced_; }
  const IterationStats& last() const { return last_; }
  GradSyncStats snapshot() const;

  // Rank 0 logs iterations 1-10, then every `log_every` (0: never after 10).
  static bool due(const IterationStats& s, int log_every);

 private:
  IterationStats last_, sum_;
  std::uint64_t iterations_ = 0, synced_ = 0;
};

}  // namespace ddp::detail
