#include "rendezvous/forming_round.h"

#include <algorithm>
#include <set>
#include <tuple>

namespace ddp::launcher {

std::optional<RpcError> FormingRound::rank_conflict(const NodeInfo& args) const {
  if (args.node_rank < 0) return std::nullopt;
  for (const Member& m : members_) {
    if (m.args.node_rank == args.node_rank) {
      return refusal(RpcCode::kInvalidArgument, "node rank ", args.node_rank,
                     " was given to two nodes: host ", quote(host_of(m.args)), " and host ",
                     quote(host_of(args)),
                     "; give each node its own --node_rank (or none, for assigned ranks)");
    }
  }
  return std::nullopt;
}

void FormingRound::add(const NodeInfo& args, std::uint64_t id, TimePoint now) {
  std::int64_t world_size = args.local_world_size;
  for (const Member& m : members_) world_size += m.args.local_world_size;
  if (world_size > config_.limits.max_world_size) {
    throw refusal(RpcCode::kResourceExhausted, "host ", quote(host_of(args)),
                  " cannot join: the world size would be ", world_size, ", limit ",
                  config_.limits.max_world_size);
  }
  if (members_.empty()) first_join_ = now;
  members_.push_back(Member{args, id, id, now, false});
  if (members_.size() == static_cast<std::size_t>(config_.min_nodes)) min_reached_ = now;
}

bool FormingRound::remove(std::uint64_t ticket) {
  return std::erase_if(members_, [&](const Member& m) { return m.ticket == ticket; }) > 0;
}

// The round closes at MAX nodes, or at the end of its last call; it must do
// so within join_timeout of its first join (as torch 2.x's c10d handler's
// deadline), else it is discarded and every joiner hears why.
FormingRound::Due FormingRound::due(TimePoint now) const {
  const auto n = static_cast<int>(members_.size());
  if (n == 0) return Due::kNothing;
  const TimePoint join_deadline = first_join_ + config_.join_timeout;
  const TimePoint last_call_end = min_reached_ + config_.last_call_timeout;
  if (n >= config_.max_nodes ||
      (n >= config_.min_nodes && now >= last_call_end && last_call_end <= join_deadline)) {
    return Due::kClose;
  }
  return now >= join_deadline ? Due::kDiscard : Due::kNothing;
}

std::string FormingRound::hosts() const {
  std::string hosts;
  for (const Member& m : members_) hosts += cat(hosts.empty() ? "" : ", ", quote(host_of(m.args)));
  return hosts;
}

// "rendezvous join timed out after 5.0s (--rdzv_conf join_timeout, ...): "
// then either "1 of 2 nodes joined (--nnodes=2; missing node rank 1; joined:
// 'a')", the missing ranks being those of [0, min_nodes) still free once the
// automatic nodes take the lowest free ones; or, with MIN in, the last call
// that would have ended after the deadline.
RpcError FormingRound::timeout_refusal() const {
  const std::string head = cat("rendezvous join timed out after ", seconds(config_.join_timeout),
                               " (--rdzv_conf join_timeout, or timeout in the static form): ");
  const auto joined = static_cast<int>(members_.size());
  if (joined >= config_.min_nodes) {
    return refusal(RpcCode::kDeadlineExceeded, head, joined, " of at most ", config_.max_nodes,
                   " nodes joined (", nnodes_flag(config_), "; joined: ", hosts(),
                   ") and the round was still in its last call for more, ", "which ends ",
                   seconds(config_.last_call_timeout), " after the minimum of ", config_.min_nodes,
                   " node(s) had joined (--rdzv_conf last_call_timeout): give a join_timeout "
                   "longer than the last call");
  }
  std::vector<bool> taken(config_.max_nodes, false);
  int automatic = 0;
  for (const Member& m : members_) {
    if (m.args.node_rank >= 0) {
      taken[m.args.node_rank] = true;
    } else {
      ++automatic;
    }
  }
  std::vector<int> missing;
  for (int r = 0; r < config_.min_nodes; ++r) {
    if (taken[r]) continue;
    if (automatic > 0) {
      --automatic;
    } else {
      missing.push_back(r);
    }
  }
  return refusal(RpcCode::kDeadlineExceeded, head, joined, " of ", config_.min_nodes,
                 " nodes joined (", nnodes_flag(config_), "; missing node ", format_ranks(missing),
                 "; joined: ", hosts(), ")");
}

std::optional<RpcError> FormingRound::misfit() const {
  const auto n = static_cast<int>(members_.size());
  for (const Member& m : members_) {
    if (m.args.node_rank >= n) {
      return refusal(RpcCode::kAborted, "node rank ", m.args.node_rank, " (host ",
                     quote(host_of(m.args)), ") does not fit: the round closed with ", n,
                     " nodes (", nnodes_flag(config_), "), so node ranks must be below ", n);
    }
  }
  return std::nullopt;
}

// Automatic ranks fill the free ones in (hostname, address, arrival) order,
// so the same machines get the same ranks in every round.
std::vector<Member> FormingRound::close(TimePoint now) {
  const std::vector<Member> joined = take();
  const auto n = static_cast<int>(joined.size());
  std::vector<int> slot(n, -1);  // group rank -> index in `joined`
  std::vector<int> automatic;
  for (int i = 0; i < n; ++i) {
    const int rank = joined[i].args.node_rank;
    if (rank < 0) {
      automatic.push_back(i);
    } else {
      slot[rank] = i;
    }
  }
  std::sort(automatic.begin(), automatic.end(), [&](int a, int b) {
    const Member &x = joined[a], &y = joined[b];
    return std::tie(x.args.hostname, x.args.address, x.arrival) <
           std::tie(y.args.hostname, y.args.address, y.arrival);
  });
  auto next_auto = automatic.begin();
  std::vector<Member> ranked;
  ranked.reserve(n);
  for (int& s : slot) {
    if (s < 0) s = *next_auto++;
    ranked.push_back(joined[s]);
    ranked.back().last_seen = now;  // the round's start counts as a heartbeat
  }
  return ranked;
}

std::vector<Member> FormingRound::take() {
  std::vector<Member> joined = std::move(members_);
  members_.clear();
  first_join_ = min_reached_ = TimePoint{};
  return joined;
}

std::optional<TimePoint> FormingRound::next_deadline() const {
  const auto joined = static_cast<int>(members_.size());
  if (joined == 0) return std::nullopt;
  const TimePoint join_deadline = first_join_ + config_.join_timeout;
  if (joined < config_.min_nodes) return join_deadline;
  return std::min(min_reached_ + config_.last_call_timeout, join_deadline);
}

std::string FormingRound::broken_invariant() const {
  if (static_cast<int>(members_.size()) > config_.max_nodes) {
    return cat("forming round has ", members_.size(), " nodes, over max_nodes");
  }
  std::set<int> claimed;
  for (const Member& m : members_) {
    if (m.args.node_rank >= 0 && !claimed.insert(m.args.node_rank).second) {
      return cat("node rank ", m.args.node_rank, " twice in the forming round");
    }
  }
  return "";
}

}  // namespace ddp::launcher
