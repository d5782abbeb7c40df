#include "observe/straggler_detector.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace ddp::launcher {
std::optional<CommonArrivals> common_arrivals(const std::vector<StragglerSample>& ranks) {
  if (ranks.empty()) return std::nullopt;
  CommonArrivals out;
  out.seq = UINT64_MAX;
  for (const auto& r : ranks) {
    if (!r.arrivals) return std::nullopt;
    out.seq = std::min(out.seq, r.arrivals->seq);
  }
  for (const auto& r : ranks) {
    const ArrivalMark& m = *r.arrivals;
    if (m.seq == out.seq) {
      out.sums.push_back(m.sum);
    } else if (m.seq == out.seq + 1) {
      out.sums.push_back(m.sum - m.last_ns);  // wraps like the sum itself
    } else {
      return std::nullopt;
    }
  }
  return out;
}

bool StragglerDetector::same_ranks(const std::vector<StragglerSample>& ranks) const {
  if (ranks.size() != last_.size()) return false;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i].rank != last_[i].rank || ranks[i].pid != last_[i].pid) return false;
  }
  return true;
}

void StragglerDetector::add_interval(const Point& next) {
  const Point& prev = *point_;
  const double dt = std::chrono::duration<double>(next.at - prev.at).count();
  // No collective began on every rank: nobody waited for anybody to arrive.
  if (dt < 1e-3 || next.arrivals.seq <= prev.arrivals.seq) return;
  const std::size_t n = next.arrivals.sums.size();
  // Each rank's total arrival time over the interval's collectives, relative
  // to rank 0's: the sums wrap, their differences over one interval do not.
  std::vector<double> rel;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t grew = next.arrivals.sums[i] - prev.arrivals.sums[i];
    const std::uint64_t grew0 = next.arrivals.sums[0] - prev.arrivals.sums[0];
    rel.push_back(static_cast<double>(static_cast<std::int64_t>(grew - grew0)) / 1e9);
  }
  StragglerInterval in;
  in.dt = dt;
  in.collectives = next.arrivals.seq - prev.arrivals.seq;
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<double> others;
    for (std::size_t k = 0; k < n; ++k) {
      if (k != i) others.push_back(rel[k]);
    }
    const double late = rel[i] - median_of(std::move(others));
    in.lateness_s.push_back(late);
    in.share.push_back(late / dt);
  }
  judge_.add(std::move(in));
}

std::vector<StragglerChange> StragglerDetector::reset(const std::string& why) {
  std::vector<StragglerChange> out;
  for (int rank : judge_.reset()) {
    out.push_back({rank, false, 0, fmt::format("rank {}: {}", rank, why)});
  }
  return out;
}

std::vector<StragglerChange> StragglerDetector::observe(Clock::time_point now,
                                                        const std::vector<StragglerSample>& ranks) {
  std::vector<StragglerChange> out;
  if (!same_ranks(ranks)) {
    // A restart, a relaunch: counters start again, so does the comparison.
    out = reset("no longer judged (the ranks were restarted)");
    point_.reset();
  }
  last_ = ranks;
  if (ranks.size() < 2) return out;
  auto arrivals = common_arrivals(ranks);
  if (!arrivals) return out;
  Point next{now, std::move(*arrivals)};
  if (point_) {
    add_interval(next);
    auto judged = judge();
    out.insert(out.end(), judged.begin(), judged.end());
  }
  point_ = std::move(next);
  return out;
}

std::vector<StragglerChange> StragglerDetector::judge() {
  std::vector<int> ranks;
  for (const auto& r : last_) ranks.push_back(r.rank);
  std::vector<StragglerChange> out;
  for (const auto& c : judge_.judge(ranks)) {
    out.push_back({ranks[c.index], c.named, c.score, evidence(c.index)});
  }
  return out;
}

std::string StragglerDetector::evidence(std::size_t i) const {
  const StragglerJudge::Totals t = judge_.totals(i);
  const double per_collective_ms =
      t.collectives > 0 ? 1000.0 * std::max(0.0, t.lateness_s) / static_cast<double>(t.collectives)
                        : 0;
  return fmt::format(
      "rank {} arrived last in {} of the last {} intervals ({:.1f} s each): the others waited for "
      "it {:.1f}% of the time (median), {:.3f} ms after them per collective over {} collectives",
      last_[i].rank, t.last, t.intervals, t.dt_s / static_cast<double>(t.intervals),
      100.0 * judge_.score(i), per_collective_ms, t.collectives);
}

double StragglerDetector::score(int rank) const {
  for (std::size_t i = 0; i < last_.size(); ++i) {
    if (last_[i].rank == rank) return judge_.score(i);
  }
  return 0;
}

}  // namespace ddp::launcher
