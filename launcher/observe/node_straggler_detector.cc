#include "observe/node_straggler_detector.h"

#include <fmt/format.h>

#include <algorithm>

namespace ddp::launcher {
namespace {

// "2-3", "5", "" (none).
std::string rank_span(const std::vector<int>& ranks) {
  if (ranks.empty()) return "";
  const auto [lo, hi] = std::minmax_element(ranks.begin(), ranks.end());
  return *lo == *hi ? std::to_string(*lo) : fmt::format("{}-{}", *lo, *hi);
}

}  // namespace

NodeStragglerDetector::Mark NodeStragglerDetector::mark_of(Clock::time_point now,
                                                           const NodeStatus& node) {
  Mark m;
  m.at = now;
  for (const auto& r : node.ranks) {
    if (!r.libddp || r.state == RankState::kExited) continue;
    m.pids.push_back(r.pid);
    m.collectives.push_back(r.collectives_done);
    m.wait_s.push_back(r.collective_wait_s);
  }
  return m;
}

std::vector<NodeStragglerChange> NodeStragglerDetector::observe(Clock::time_point now,
                                                                const NodeStatus& node) {
  std::vector<NodeStragglerChange> out;
  if (node.round < round_) return out;  // a late report of an earlier round
  if (node.round > round_) {
    // A new round: other members, counters from zero.
    out = reset("no longer judged (a new round began)");
    nodes_.clear();
    round_ = node.round;
  }
  Node& n = nodes_[node.node_rank];
  Mark m = mark_of(now, node);
  if (n.from && m.pids != n.from->pids) {
    // A restart or relaunch: counters start again, so does the comparison.
    out = reset("no longer judged (its ranks were restarted)");
  }
  n.host = node.host;
  n.ranks.clear();
  for (const auto& r : node.ranks) n.ranks.push_back(r.rank);
  n.latest = std::move(m);
  if (!n.from) n.from = n.latest;
  if (nodes_.size() < 2 || !interval_complete()) return out;
  add_interval();
  std::vector<int> keys;
  for (const auto& [rank, x] : nodes_) keys.push_back(rank);
  for (const auto& c : judge_.judge(keys)) {
    out.push_back({keys[c.index], c.named, c.score, evidence(c.index, keys[c.index])});
  }
  return out;
}

bool NodeStragglerDetector::interval_complete() const {
  for (const auto& [rank, n] : nodes_) {
    if (!n.from || n.latest.pids.empty() || n.latest.at <= n.from->at) return false;
    for (std::size_t i = 0; i < n.latest.collectives.size(); ++i) {
      if (n.latest.collectives[i] <= n.from->collectives[i]) return false;  // no progress yet
    }
  }
  return true;
}

void NodeStragglerDetector::add_interval() {
  std::vector<double> wait, rate, dt;  // per node: wait per collective, collectives/s, seconds
  std::vector<std::uint64_t> done;
  for (const auto& [rank, n] : nodes_) {
    const Mark& a = *n.from;
    const Mark& b = n.latest;
    const double seconds = std::chrono::duration<double>(b.at - a.at).count();
    std::vector<double> waits, rates;
    std::vector<double> counts;
    for (std::size_t i = 0; i < b.collectives.size(); ++i) {
      const double c = static_cast<double>(b.collectives[i] - a.collectives[i]);
      waits.push_back((b.wait_s[i] - a.wait_s[i]) / c);
      rates.push_back(c / seconds);
      counts.push_back(c);
    }
    wait.push_back(*std::max_element(waits.begin(), waits.end()));  // its earliest rank's
    rate.push_back(median_of(rates));
    done.push_back(static_cast<std::uint64_t>(median_of(counts)));
    dt.push_back(seconds);
  }
  StragglerInterval in;
  in.dt = median_of(dt);
  in.collectives = *std::min_element(done.begin(), done.end());
  for (std::size_t i = 0; i < wait.size(); ++i) {
    std::vector<double> others;
    for (std::size_t k = 0; k < wait.size(); ++k) {
      if (k != i) others.push_back(wait[k]);
    }
    const double late_per_collective = median_of(others) - wait[i];
    in.share.push_back(late_per_collective * rate[i]);
    in.lateness_s.push_back(late_per_collective * static_cast<double>(done[i]));
  }
  judge_.add(std::move(in));
  for (auto& [rank, n] : nodes_) n.from = n.latest;
}

std::vector<NodeStragglerChange> NodeStragglerDetector::reset(const std::string& why) {
  std::vector<NodeStragglerChange> out;
  for (int node : judge_.reset()) {
    out.push_back({node, false, 0, fmt::format("node {}: {}", node, why)});
  }
  for (auto& [rank, n] : nodes_) n.from.reset();
  return out;
}

std::string NodeStragglerDetector::evidence(std::size_t index, int node) const {
  const StragglerJudge::Totals t = judge_.totals(index);
  const Node& n = nodes_.at(node);
  const double per_collective_ms =
      t.collectives > 0 ? 1000.0 * std::max(0.0, t.lateness_s) / static_cast<double>(t.collectives)
                        : 0;
  return fmt::format(
      "node {} (host {}, ranks {}) arrived last in {} of the last {} intervals ({:.1f} s each): "
      "the other nodes waited for it {:.1f}% of the time (median), {:.3f} ms per collective over "
      "{} collectives",
      node, n.host, rank_span(n.ranks), t.last, t.intervals,
      t.dt_s / static_cast<double>(t.intervals), 100.0 * judge_.score(index), per_collective_ms,
      t.collectives);
}

std::vector<NodeStragglerScore> NodeStragglerDetector::scores() const {
  std::vector<NodeStragglerScore> out;
  for (const auto& [rank, n] : nodes_) out.push_back({rank, n.host, score(rank), named(rank)});
  return out;
}

double NodeStragglerDetector::score(int node) const {
  std::size_t i = 0;
  for (const auto& [rank, n] : nodes_) {
    if (rank == node) return judge_.score(i);
    ++i;
  }
  return 0;
}

}  // namespace ddp::launcher
