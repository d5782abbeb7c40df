// RendezvousState under --on_failure=heal: a node whose heartbeats stop is
// lost, left out of its running round, which goes on while at least
// min_nodes remain (the workers of the others heal without its ranks); a
// node that joins later takes a lost node's place in the running round, or
// joins it as one more node.

#include <algorithm>
#include <optional>

#include "rendezvous/messages.h"
#include "rendezvous/rendezvous_state.h"

namespace ddp::launcher {

void RendezvousState::lose(Round& r, int group_rank, const std::string& why) {
  Member& m = r.members[group_rank];
  m.lost = m.left = m.informed = true;  // gone: nobody to tell
  // For the workers of the other nodes, whose groups stop waiting on its ranks.
  try {
    const std::int64_t k = store_.add(lost_nodes_key(current_round()), 1);
    store_.set(lost_node_key(current_round(), k), cat(group_rank, " ", why));
  } catch (const RpcError&) {
    // A full store: the other nodes' workers notice at their groups' timeout.
  }
  const auto going_on = std::count_if(r.members.begin(), r.members.end(),
                                      [](const Member& other) { return !other.lost; });
  if (lost_observer_) {
    lost_observer_(cat(why, ": left out of round ", current_round(), " (--on_failure=heal); ",
                       going_on, " node(s) go on"));
  }
}

void RendezvousState::lose_silent_nodes(Round& r, TimePoint now) {
  std::string last;
  for (int i = 0; i < static_cast<int>(r.members.size()); ++i) {
    const Member& m = r.members[i];
    if (m.left || now < m.last_seen + config_.heartbeat_timeout) continue;
    last = cat(describe_node(r, i), " stopped sending heartbeats for ", seconds(now - m.last_seen));
    lose(r, i, last);
  }
  changed();
  const auto live =
      std::count_if(r.members.begin(), r.members.end(), [](const Member& m) { return !m.lost; });
  if (live < config_.min_nodes) {
    end_round(r, cat(last, "; ", live, " node(s) remain, fewer than the ", config_.min_nodes,
                     " the job needs (", nnodes_flag(), ")"));
  } else if (std::all_of(r.members.begin(), r.members.end(),
                         [](const Member& m) { return m.left; })) {
    r.ended = r.succeeded = true;  // the others had finished
  }
}

RoundStatus RendezvousState::lost_status(const Round& r, int group_rank) const {
  const auto number =
      std::find_if(rounds_.begin(), rounds_.end(), [&](const Round& x) { return &x == &r; }) -
      rounds_.begin() + 1;
  const Member& m = r.members[group_rank];
  if (!m.lost) {  // the caller is a node whose place another took
    return RoundStatus{true, false, false,
                       cat("this node was left out of round ", number, " and host ",
                           quote(host_of(m.args)), " took its place as node ", group_rank,
                           "; the other nodes went on without it (--on_failure=heal)")};
  }
  return RoundStatus{true, false, false,
                     cat(describe_node(r, group_rank), " was left out of round ", number,
                         " after its heartbeats stopped; the other nodes went on without it "
                         "(--on_failure=heal)")};
}

// Ids grow with every join: a holder whose place another took has the
// smaller one. A larger id is the holder itself, joined to a later round
// since (its last word about this one, such as heard_end, may come after).
bool RendezvousState::replaced(const Round& r, int group_rank, std::uint64_t member) const {
  return member != 0 && member < r.members[group_rank].ticket;
}

// A lost place with the joiner's local world size (so that the ranks fit):
// its own when it is that node relaunched, else the one its explicit node
// rank names, else the lowest. A live node's own place too: the node joining
// again proves its old agent gone.
std::optional<int> RendezvousState::place_to_take(const Round& r, const NodeInfo& args) const {
  const int size = static_cast<int>(r.members.size());
  std::optional<int> lowest_lost;
  for (int i = 0; i < size; ++i) {
    const Member& m = r.members[i];
    if (m.args.local_world_size != args.local_world_size) continue;
    if (same_node(m.args, args) && (m.lost || !m.left)) return i;
    if (m.lost && args.node_rank == i) return i;
    if (m.lost && args.node_rank < 0 && !lowest_lost) lowest_lost = i;
  }
  return lowest_lost;
}

JoinTicket RendezvousState::take_place(Round& r, int group_rank, const NodeInfo& args,
                                       TimePoint now) {
  const std::string host = quote(host_of(args));
  if (store_.add(kHealRelaunchesKey, 0) >= config_.max_restarts) {
    throw refusal(RpcCode::kFailedPrecondition, "host ", host, " cannot take the place of ",
                  describe_node(r, group_rank), " in running round ", current_round(),
                  ": no restarts left for it (--max_restarts=", config_.max_restarts,
                  ", spent on relaunches)");
  }
  store_.add(kHealRelaunchesKey, 1);
  if (!r.members[group_rank].lost) {
    lose(r, group_rank, cat(describe_node(r, group_rank), " was relaunched (a new agent joined)"));
  }
  const std::string was = host_of(r.members[group_rank].args);
  const std::uint64_t id = next_id_++;
  r.members[group_rank] = Member{args, id, id, now, false, false, false};
  const RoundAssignment place = answer_joined_running(r, group_rank);
  if (lost_observer_) {
    lost_observer_(cat("host ", host, " takes the place of lost host ", quote(was), " as node ",
                       group_rank, " in running round ", current_round(), " (ranks ",
                       place.global_rank_offset, "-",
                       place.global_rank_offset + args.local_world_size - 1,
                       "; --on_failure=heal): its workers heal from the live ranks"));
  }
  return JoinTicket{id};
}

std::optional<JoinTicket> RendezvousState::grow_running_round(Round& r, const NodeInfo& args,
                                                              TimePoint now) {
  const int size = static_cast<int>(r.members.size());
  if (size >= config_.max_nodes || (args.node_rank >= 0 && args.node_rank != size)) {
    return std::nullopt;
  }
  if (r.common.world_size + args.local_world_size > config_.limits.max_world_size) {
    return std::nullopt;
  }
  for (const Member& m : r.members) {  // one of the round's own: not a newcomer
    if (!m.left && same_node(m.args, args)) return std::nullopt;
  }
  if (!store_.get(healing_round_key(current_round()))) return std::nullopt;
  const std::uint64_t id = next_id_++;
  r.members.push_back(Member{args, id, id, now, false, false, false});
  const int world_before = r.common.world_size;
  r.common.group_world_size = size + 1;
  r.common.world_size += args.local_world_size;
  const RoundAssignment place = answer_joined_running(r, size);
  if (lost_observer_) {
    lost_observer_(cat("host ", quote(host_of(args)), " joins running round ", current_round(),
                       " as node ", size, " (ranks ", place.global_rank_offset, "-",
                       place.global_rank_offset + args.local_world_size - 1, "; world ",
                       world_before, " -> ", r.common.world_size,
                       "; --on_failure=heal): the live ranks admit its workers"));
  }
  return JoinTicket{id};
}

RoundAssignment RendezvousState::answer_joined_running(const Round& r, int group_rank) {
  RoundAssignment place = assignment_of(r, group_rank);
  place.joined_running = true;
  join_tickets_[place.member] = place;
  changed();
  return place;
}

RoundAssignment RendezvousState::assignment_of(const Round& r, int group_rank) const {
  RoundAssignment a = r.common;
  a.group_rank = group_rank;
  a.member = r.members[group_rank].ticket;
  for (int g = 0; g < group_rank; ++g) a.global_rank_offset += r.members[g].args.local_world_size;
  return a;
}

}  // namespace ddp::launcher
