#include "agent/straggler_detector.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace ddp::launcher {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const std::size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double hi = v[mid];
  if (v.size() % 2 == 1) return hi;
  const double lo = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
  return (lo + hi) / 2;
}

}  // namespace

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

StragglerRule straggler_rule(double window_s, double interval_s) {
  StragglerRule rule;
  if (!(window_s > 0 && interval_s > 0)) return rule;  // not judged (the observer checks)
  rule.window = std::max(4, static_cast<int>(std::lround(window_s / interval_s)));
  rule.min_intervals = rule.window / 2;
  return rule;
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
  Interval in;
  in.dt = dt;
  in.collectives = next.arrivals.seq - prev.arrivals.seq;
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<double> others;
    for (std::size_t k = 0; k < n; ++k) {
      if (k != i) others.push_back(rel[k]);
    }
    const double late = rel[i] - median(std::move(others));
    in.lateness_s.push_back(late);
    in.share.push_back(late / dt);
  }
  intervals_.push_back(std::move(in));
  while (static_cast<int>(intervals_.size()) > rule_.window) intervals_.pop_front();
}

std::vector<StragglerChange> StragglerDetector::reset(const std::string& why) {
  std::vector<StragglerChange> out;
  for (const auto& [rank, score] : named_) {
    out.push_back({rank, false, 0, fmt::format("rank {}: {}", rank, why)});
  }
  named_.clear();
  intervals_.clear();
  scores_.clear();
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
  std::vector<StragglerChange> out;
  scores_.clear();
  if (static_cast<int>(intervals_.size()) < rule_.min_intervals) return out;
  const std::size_t n = last_.size();
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<double> shares;
    for (const auto& in : intervals_) shares.push_back(in.share[i]);
    scores_.push_back(std::clamp(median(std::move(shares)), 0.0, 1.0));
  }
  for (std::size_t i = 0; i < n; ++i) {
    const int rank = last_[i].rank;
    const double s = scores_[i];
    const bool was = named(rank);
    const double last = static_cast<double>(intervals_last(i)) / intervals_.size();
    if (!was && s >= rule_.name_share && last >= rule_.last_fraction) {
      named_[rank] = s;
      out.push_back({rank, true, s, evidence(i, s)});
    } else if (was && s < rule_.clear_share) {
      named_.erase(rank);
      out.push_back({rank, false, s, evidence(i, s)});
    }
  }
  return out;
}

int StragglerDetector::intervals_last(std::size_t i) const {
  int last = 0;
  for (const auto& in : intervals_) {
    const auto top = std::max_element(in.share.begin(), in.share.end());
    if (static_cast<std::size_t>(top - in.share.begin()) == i && *top > 0) ++last;
  }
  return last;
}

std::string StragglerDetector::evidence(std::size_t i, double score) const {
  const int last = intervals_last(i);
  double late = 0, dt = 0;
  std::uint64_t collectives = 0;
  for (const auto& in : intervals_) {
    late += in.lateness_s[i];
    collectives += in.collectives;
    dt += in.dt;
  }
  const double per_collective_ms =
      collectives > 0 ? 1000.0 * std::max(0.0, late) / static_cast<double>(collectives) : 0;
  return fmt::format(
      "rank {} arrived last in {} of the last {} intervals ({:.1f} s each): the others waited for "
      "it {:.1f}% of the time (median), {:.3f} ms after them per collective over {} collectives",
      last_[i].rank, last, intervals_.size(), dt / static_cast<double>(intervals_.size()),
      100.0 * score, per_collective_ms, collectives);
}

double StragglerDetector::score(int rank) const {
  for (std::size_t i = 0; i < scores_.size() && i < last_.size(); ++i) {
    if (last_[i].rank == rank) return scores_[i];
  }
  return 0;
}

}  // namespace ddp::launcher
