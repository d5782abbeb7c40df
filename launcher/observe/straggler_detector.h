#pragma once
// Names a rank that the others persistently wait for (docs/observability.md,
// "Stragglers"). Pure logic: the agent reads its libddp ranks' progress
// slots about once a second (--status_interval) and passes the time in;
// unit-tested with made-up samples.
//
// The signal. libddp adds up, per rank, the times at which the rank began
// its collectives (ArrivalMark::sum, CLOCK_MONOTONIC: one clock for every
// rank of a node). Over the same collectives, the difference between two
// ranks' sums is how much later one arrived than the other, in total. Per
// interval between two samples, rank r's lateness is its sum's growth minus
// the median of the other ranks' (over the collectives all ranks began in
// the interval), and its share of the interval is lateness / dt: the share
// of the time the others spent waiting for it to arrive.
//
// The rule (straggler_judge.h). A rank's score is the median of its shares
// over the last `window` intervals (at least `min_intervals` of them): one
// noisy interval, or a few, moves a median by nothing. A rank is named when
// its score reaches `name_share` and it arrived last in `last_fraction` of
// those intervals, and cleared when its score falls below `clear_share`
// (hysteresis: a score hovering at the threshold does not flap).

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ddp/common/progress_board.h"
#include "observe/straggler_judge.h"

namespace ddp::launcher {

struct StragglerSample {
  int rank = 0;  // global rank
  int pid = -1;  // a new pid (a relaunch) starts the history again
  // A running libddp rank's arrivals (read_arrivals); a sample in which a
  // rank has none tells nothing and is skipped.
  std::optional<ArrivalMark> arrivals;
};

// The number of collectives every rank has begun (the smallest count), and
// each rank's arrival sum over exactly those: a rank one collective ahead
// gives back its last arrival. nullopt when a rank has no arrivals or is
// more than one collective ahead (libddp's ranks run in step; the next
// sample will do).
struct CommonArrivals {
  std::uint64_t seq = 0;
  std::vector<std::uint64_t> sums;  // in the samples' order
};
std::optional<CommonArrivals> common_arrivals(const std::vector<StragglerSample>& ranks);

// A rank named, or one that recovered.
struct StragglerChange {
  int rank = 0;
  bool named = false;  // false: recovered (or its history started again)
  double score = 0;
  // E.g. "rank 1 arrived last in 19 of the last 20 intervals (1.0 s each):
  // the others waited for it 17.9% of the time (median), 0.21 ms after them
  // per collective over 8500 collectives".
  std::string evidence;
};

class StragglerDetector {
 public:
  using Clock = std::chrono::steady_clock;
  explicit StragglerDetector(StragglerRule rule = {}) : judge_(rule) {}

  // Takes one sample of this node's ranks (in the same order each time).
  // Returns the ranks named or cleared by it.
  std::vector<StragglerChange> observe(Clock::time_point now,
                                       const std::vector<StragglerSample>& ranks);

  // The rank's score (a share of wall time, 0 to 1), 0 without enough
  // intervals or for an unknown rank.
  double score(int rank) const;
  bool named(int rank) const { return judge_.named(rank); }

 private:
  struct Point {
    Clock::time_point at;
    CommonArrivals arrivals;
  };
  bool same_ranks(const std::vector<StragglerSample>& ranks) const;
  void add_interval(const Point& next);
  std::vector<StragglerChange> reset(const std::string& why);
  std::vector<StragglerChange> judge();
  std::string evidence(std::size_t i) const;

  StragglerJudge judge_;
  std::vector<StragglerSample> last_;  // the ranks of the previous sample
  std::optional<Point> point_;         // the previous sample with common arrivals
};

}  // namespace ddp::launcher
