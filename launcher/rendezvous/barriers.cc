#include "rendezvous/barriers.h"

#include <vector>

#include "rendezvous/messages.h"

namespace ddp::launcher {

BarrierTicket Barriers::arrive(const std::string& name, int rank, int world_size,
                               const std::string& host, TimePoint deadline, TimePoint now) {
  if (name.empty()) throw refusal(RpcCode::kInvalidArgument, "barrier name is empty");
  if (name.size() > limits_.max_key_bytes) {
    throw refusal(RpcCode::kInvalidArgument, "barrier name ", quote(name), " is ", name.size(),
                  " bytes, limit ", limits_.max_key_bytes);
  }
  const std::string what = cat("barrier ", quote(name), ": ");
  if (world_size < 1 || world_size > limits_.max_world_size) {
    throw refusal(RpcCode::kInvalidArgument, what, "world size ", world_size, " is outside [1, ",
                  limits_.max_world_size, "]");
  }
  if (rank < 0 || rank >= world_size) {
    throw refusal(RpcCode::kInvalidArgument, what, "rank ", rank, " is outside [0, ", world_size,
                  ")");
  }
  auto it = open_.find(name);
  if (it == open_.end()) {
    if (open_.size() >= limits_.max_open_barriers) {
      throw refusal(RpcCode::kResourceExhausted, "cannot open ", what, open_.size(),
                    " barriers are open, limit ", limits_.max_open_barriers);
    }
    it = open_.emplace(name, Barrier{world_size, {}, {}}).first;
  } else if (it->second.world_size != world_size) {
    throw refusal(RpcCode::kInvalidArgument, what, "rank ", rank, " gives world size ", world_size,
                  ", earlier ranks gave ", it->second.world_size);
  } else if (auto first = it->second.arrived.find(rank); first != it->second.arrived.end()) {
    throw refusal(RpcCode::kInvalidArgument, what, "rank ", rank,
                  " arrived twice (first from host ", quote(first->second.host), ")");
  }
  Barrier& barrier = it->second;
  const std::uint64_t id = next_ticket_++;
  barrier.arrived[rank] = Arrival{id, host, now, deadline};
  barrier.gave_up.erase(rank);
  tickets_[id] = Pending{name, rank, false, std::nullopt};
  deadlines_.emplace(deadline, id);
  ++changes_;
  if (barrier.arrived.size() == static_cast<std::size_t>(world_size)) {
    for (const auto& [r, arrival] : barrier.arrived) {
      tickets_[arrival.ticket].final = true;
      deadlines_.erase({arrival.deadline, arrival.ticket});
    }
    open_.erase(it);  // the next arrival under this name starts a new generation
  }
  return BarrierTicket{id};
}

void Barriers::withdraw(const std::string& name, int rank) {
  auto it = open_.find(name);
  if (it == open_.end()) return;
  auto arrival = it->second.arrived.find(rank);
  if (arrival == it->second.arrived.end()) return;
  deadlines_.erase({arrival->second.deadline, arrival->second.ticket});
  it->second.arrived.erase(arrival);
  if (it->second.arrived.empty()) open_.erase(it);
  ++changes_;
}

// "ranks 1, 3 never arrived (arrived: rank 0 on 'a', ranks 2, 4-7 on 'b')".
std::string Barriers::describe_missing(const Barrier& barrier) {
  std::vector<std::pair<int, int>> missing;  // inclusive ranges between arrivals
  std::map<std::string, std::vector<int>> ranks_by_host;
  // Ranks that are here or came and gave up split [0, world_size) into the gaps of absentees.
  std::set<int> seen(barrier.gave_up);
  for (const auto& [rank, arrival] : barrier.arrived) {
    seen.insert(rank);
    ranks_by_host[arrival.host].push_back(rank);
  }
  int prev = -1;
  for (int rank : seen) {
    if (rank > prev + 1) missing.emplace_back(prev + 1, rank - 1);
    prev = rank;
  }
  if (prev + 1 < barrier.world_size) missing.emplace_back(prev + 1, barrier.world_size - 1);
  std::string text;
  if (!missing.empty()) {
    text = cat(format_ranks(missing, barrier.world_size - static_cast<long>(seen.size())),
               " never arrived");
  }
  if (!barrier.gave_up.empty()) {
    text += cat(text.empty() ? "" : "; ",
                format_ranks(std::vector<int>(barrier.gave_up.begin(), barrier.gave_up.end())),
                " arrived but timed out first");
  }
  text += " (arrived: ";
  int shown = 0;
  for (const auto& [host, ranks] : ranks_by_host) {
    if (shown++ == 8) return cat(text, ", ... (", ranks_by_host.size(), " hosts in all))");
    text += cat(shown > 1 ? ", " : "", format_ranks(ranks), " on ", quote(host));
  }
  return text + ")";
}

void Barriers::expire(TimePoint now) {
  // Tickets of one barrier expiring together share one description of who is
  // missing, so a mass timeout costs one pass over the barrier, not one each.
  std::map<std::string, std::vector<std::uint64_t>> expired;
  for (auto it = deadlines_.begin(); it != deadlines_.end() && it->first <= now; ++it) {
    expired[tickets_.at(it->second).name].push_back(it->second);
  }
  for (const auto& [name, tickets] : expired) {
    const Barrier& barrier = open_.at(name);
    const std::string missing = describe_missing(barrier);
    for (std::uint64_t id : tickets) {
      Pending& pending = tickets_.at(id);
      const Arrival& arrival = barrier.arrived.at(pending.rank);
      pending.final = true;
      pending.failure =
          refusal(RpcCode::kDeadlineExceeded, "barrier ", quote(name), " timed out after ",
                  seconds(arrival.deadline - arrival.arrived), ": ", missing);
    }
    for (std::uint64_t id : tickets) {
      const int rank = tickets_.at(id).rank;
      withdraw(name, rank);  // may erase the barrier (then nobody waits on it)
      if (auto open = open_.find(name); open != open_.end()) open->second.gave_up.insert(rank);
    }
  }
}

bool Barriers::passed(BarrierTicket ticket) {
  auto it = tickets_.find(ticket.id);
  if (it == tickets_.end()) throw refusal(RpcCode::kNotFound, "unknown barrier ticket ", ticket.id);
  if (!it->second.final) return false;
  std::optional<RpcError> failure = std::move(it->second.failure);
  tickets_.erase(it);
  if (failure) throw *failure;
  return true;
}

void Barriers::cancel(BarrierTicket ticket) {
  auto it = tickets_.find(ticket.id);
  if (it == tickets_.end()) return;
  if (!it->second.final) withdraw(it->second.name, it->second.rank);
  tickets_.erase(it);
}

std::optional<TimePoint> Barriers::next_deadline() const {
  if (deadlines_.empty()) return std::nullopt;
  return deadlines_.begin()->first;
}

std::string Barriers::broken_invariant() const {
  for (const auto& [name, barrier] : open_) {
    if (static_cast<int>(barrier.arrived.size()) >= barrier.world_size) {
      return cat("barrier ", quote(name), " is complete but still open");
    }
    for (const auto& [rank, arrival] : barrier.arrived) {
      if (rank < 0 || rank >= barrier.world_size)
        return cat("barrier ", quote(name), " holds rank ", rank);
      if (barrier.gave_up.contains(rank))
        return cat("barrier ", quote(name), ": rank ", rank, " both waits and gave up");
    }
  }
  return "";
}

}  // namespace ddp::launcher
