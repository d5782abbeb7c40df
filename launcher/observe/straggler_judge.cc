#include "observe/straggler_judge.h"

#include <algorithm>
#include <cmath>

namespace ddp::launcher {

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  const std::size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double hi = v[mid];
  if (v.size() % 2 == 1) return hi;
  const double lo = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
  return (lo + hi) / 2;
}

StragglerRule straggler_rule(double window_s, double interval_s) {
  StragglerRule rule;
  if (!(window_s > 0 && interval_s > 0)) return rule;  // not judged (the observer checks)
  rule.window = std::max(4, static_cast<int>(std::lround(window_s / interval_s)));
  rule.min_intervals = rule.window / 2;
  return rule;
}

void StragglerJudge::add(StragglerInterval interval) {
  intervals_.push_back(std::move(interval));
  while (static_cast<int>(intervals_.size()) > rule_.window) intervals_.pop_front();
}

std::vector<StragglerJudge::Change> StragglerJudge::judge(const std::vector<int>& keys) {
  std::vector<Change> out;
  scores_.clear();
  if (static_cast<int>(intervals_.size()) < rule_.min_intervals) return out;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    std::vector<double> shares;
    for (const auto& in : intervals_) shares.push_back(in.share.at(i));
    scores_.push_back(std::clamp(median_of(std::move(shares)), 0.0, 1.0));
  }
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const double s = scores_[i];
    const bool was = named(keys[i]);
    const double last = static_cast<double>(intervals_last(i)) / intervals_.size();
    if (!was && s >= rule_.name_share && last >= rule_.last_fraction) {
      named_[keys[i]] = s;
      out.push_back({i, true, s});
    } else if (was && s < rule_.clear_share) {
      named_.erase(keys[i]);
      out.push_back({i, false, s});
    }
  }
  return out;
}

std::vector<int> StragglerJudge::reset() {
  std::vector<int> were;
  for (const auto& [key, score] : named_) were.push_back(key);
  named_.clear();
  intervals_.clear();
  scores_.clear();
  return were;
}

int StragglerJudge::intervals_last(std::size_t index) const {
  int last = 0;
  for (const auto& in : intervals_) {
    const auto top = std::max_element(in.share.begin(), in.share.end());
    if (static_cast<std::size_t>(top - in.share.begin()) == index && *top > 0) ++last;
  }
  return last;
}

StragglerJudge::Totals StragglerJudge::totals(std::size_t index) const {
  Totals t;
  t.last = intervals_last(index);
  t.intervals = intervals_.size();
  for (const auto& in : intervals_) {
    t.lateness_s += in.lateness_s.at(index);
    t.collectives += in.collectives;
    t.dt_s += in.dt;
  }
  return t;
}

double StragglerJudge::score(std::size_t index) const {
  return index < scores_.size() ? scores_[index] : 0;
}

}  // namespace ddp::launcher
