#pragma once
// The verdict shared by the straggler detectors (straggler_detector.h for
// the ranks of a node, node_straggler_detector.h for the nodes of a job):
// given, per interval, each member's share of the time the others waited
// for it, a member's score is the median of its shares over the last
// `window` intervals (at least `min_intervals`); it is named when its score
// reaches `name_share` and it arrived last (the largest positive share) in
// `last_fraction` of the intervals, and cleared when its score falls below
// `clear_share`. Pure logic.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

namespace ddp::launcher {

struct StragglerRule {
  int window = 40;         // intervals the score is the median of
  int min_intervals = 20;  // no score (and no verdict) with fewer
  double name_share = 0.05;
  double clear_share = 0.025;
  // Naming also needs the member to have arrived last (a positive share) in
  // this fraction of the window's intervals: a trend, not a few bursts.
  double last_fraction = 0.8;
};
// The rule for a window of `window_s` seconds sampled every `interval_s`
// (--straggler_window, --status_interval): the window in intervals (at
// least 4), half of it before any score.
StragglerRule straggler_rule(double window_s, double interval_s);

// One interval: per member (in a fixed order), how much later than the
// others it arrived in total and that as a share of the interval.
struct StragglerInterval {
  double dt = 0;
  std::vector<double> share;
  std::vector<double> lateness_s;
  std::uint64_t collectives = 0;
};

class StragglerJudge {
 public:
  explicit StragglerJudge(StragglerRule rule) : rule_(rule) {}

  // A member named (true) or cleared (false) by the latest judge().
  struct Change {
    std::size_t index = 0;
    bool named = false;
    double score = 0;
  };
  // What evidence names: over the window, in how many intervals the member
  // arrived last, its total lateness, the time and collectives covered.
  struct Totals {
    int last = 0;
    std::size_t intervals = 0;
    double lateness_s = 0;
    double dt_s = 0;
    std::uint64_t collectives = 0;
  };

  void add(StragglerInterval interval);  // keeps the last rule.window
  // Scores every member (`keys`: the members' ids in the intervals' order)
  // and returns the verdicts that changed.
  std::vector<Change> judge(const std::vector<int>& keys);
  // Forgets the intervals and verdicts; returns the keys that were named.
  std::vector<int> reset();

  Totals totals(std::size_t index) const;
  // The member's score (0 to 1) at the latest judge(); 0 before enough intervals.
  double score(std::size_t index) const;
  bool named(int key) const { return named_.count(key) != 0; }

 private:
  int intervals_last(std::size_t index) const;

  StragglerRule rule_;
  std::deque<StragglerInterval> intervals_;
  std::vector<double> scores_;
  std::map<int, double> named_;  // key -> score when named
};

// The median of `v` (the mean of the middle two for an even count); 0 when empty.
double median_of(std::vector<double> v);

}  // namespace ddp::launcher
