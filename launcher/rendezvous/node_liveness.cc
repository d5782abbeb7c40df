#include "rendezvous/node_liveness.h"

#include <algorithm>

namespace ddp::launcher {
namespace {

RoundStatus end_of(const Round& r) {
  return RoundStatus{true, r.succeeded, r.can_restart, r.reason};
}

}  // namespace

// --- What the nodes report ---------------------------------------------------

RoundStatus NodeLiveness::heartbeat(Round& r, std::int64_t number, int group_rank, TimePoint now,
                                    bool heard_end, std::uint64_t member) {
  if (r.members[group_rank].lost || replaced(r, group_rank, member)) {
    return lost_status(r, number, group_rank);
  }
  if (r.ended) {
    if (heard_end) r.members[group_rank].informed = true;
    return end_of(r);
  }
  Member& m = r.members[group_rank];
  // Only the member due first moves the bound (next_deadline() is exact).
  if (earliest_silent_ && m.last_seen + config_.heartbeat_timeout <= *earliest_silent_)
    earliest_round_ = -1;
  m.last_seen = now;
  return RoundStatus{};
}

std::optional<RoundStatus> NodeLiveness::round_end(const Round& r, std::int64_t number,
                                                   int group_rank, std::uint64_t member) const {
  if (r.members[group_rank].lost || replaced(r, group_rank, member)) {
    return lost_status(r, number, group_rank);
  }
  if (!r.ended) return std::nullopt;
  return end_of(r);
}

bool NodeLiveness::report_failure(Round& r, int group_rank, const std::string& report,
                                  int exit_code, std::uint64_t member) {
  // The others went on without it.
  if (r.members[group_rank].lost || replaced(r, group_rank, member)) return false;
  r.members[group_rank].informed = true;  // the reporter knows
  rounds_.end_round(r, !report.empty() ? report
                                       : cat(describe_node(r, group_rank),
                                             " reported a failure, exit code ", exit_code));
  return r.can_restart;
}

void NodeLiveness::leave(Round& r, int group_rank, int exit_code, std::uint64_t member) {
  if (r.members[group_rank].left || replaced(r, group_rank, member)) return;
  r.members[group_rank].left = true;
  earliest_round_ = -1;
  if (exit_code != 0) {
    r.members[group_rank].informed = true;  // it failed: it knows
    rounds_.end_round(r, cat(describe_node(r, group_rank), " left with exit code ", exit_code));
  } else if (!r.ended && std::all_of(r.members.begin(), r.members.end(),
                                     [](const Member& m) { return m.left; })) {
    r.ended = r.succeeded = true;
  }
  ++changes_;
}

// Ids grow with every join: a holder whose place another took has the
// smaller one. A larger id is the holder itself, joined to a later round
// since (its last word about this one, such as heard_end, may come after).
bool NodeLiveness::replaced(const Round& r, int group_rank, std::uint64_t member) {
  return member != 0 && member < r.members[group_rank].ticket;
}

// --- Silence -----------------------------------------------------------------

void NodeLiveness::expire(TimePoint now) {
  Round* running = rounds_.running();
  if (running == nullptr) return;
  Round& r = *running;
  if (earliest_round_ == r.common.round && earliest_silent_ && now < *earliest_silent_) return;
  int silent = -1;  // the longest silent node, the lowest group rank on ties
  for (int i = 0; i < static_cast<int>(r.members.size()); ++i) {
    Member& m = r.members[i];
    if (m.left || now < m.last_seen + config_.heartbeat_timeout) continue;
    m.informed = true;  // gone: nobody to tell
    if (silent < 0 || m.last_seen < r.members[silent].last_seen) silent = i;
  }
  if (silent < 0) {
    scan_earliest_silent(r);
    return;
  }
  earliest_round_ = -1;  // members change below
  if (config_.heal) return lose_silent_nodes(r, now);
  rounds_.end_round(r, cat(describe_node(r, silent), " stopped sending heartbeats for ",
                           seconds(now - r.members[silent].last_seen)));
}

std::optional<TimePoint> NodeLiveness::next_deadline() const {
  const Round* running = rounds_.running();
  if (running == nullptr) return std::nullopt;
  if (earliest_round_ == running->common.round) return earliest_silent_;
  return scan_earliest_silent(*running);
}

std::optional<TimePoint> NodeLiveness::scan_earliest_silent(const Round& r) const {
  std::optional<TimePoint> next;
  for (const Member& m : r.members) {
    const TimePoint silent_at = m.last_seen + config_.heartbeat_timeout;
    if (!m.left && (!next || silent_at < *next)) next = silent_at;
  }
  earliest_silent_ = next;
  earliest_round_ = r.common.round;
  return next;
}

// Under heal the round goes on without them while at least min_nodes remain
// (the workers of the others heal without their ranks).
void NodeLiveness::lose_silent_nodes(Round& r, TimePoint now) {
  std::string last;
  for (int i = 0; i < static_cast<int>(r.members.size()); ++i) {
    const Member& m = r.members[i];
    if (m.left || now < m.last_seen + config_.heartbeat_timeout) continue;
    last = cat(describe_node(r, i), " stopped sending heartbeats for ", seconds(now - m.last_seen));
    lose(r, i, last);
  }
  ++changes_;
  const auto live =
      std::count_if(r.members.begin(), r.members.end(), [](const Member& m) { return !m.lost; });
  if (live < config_.min_nodes) {
    rounds_.end_round(r, cat(last, "; ", live, " node(s) remain, fewer than the ",
                             config_.min_nodes, " the job needs (", nnodes_flag(config_), ")"));
  } else if (std::all_of(r.members.begin(), r.members.end(),
                         [](const Member& m) { return m.left; })) {
    r.ended = r.succeeded = true;  // the others had finished
  }
}

void NodeLiveness::lose(Round& r, int group_rank, const std::string& why) {
  Member& m = r.members[group_rank];
  m.lost = m.left = m.informed = true;  // gone: nobody to tell
  earliest_round_ = -1;
  const std::int64_t round = rounds_.current_round();
  // For the workers of the other nodes, whose groups stop waiting on its ranks.
  try {
    const std::int64_t k = store_.add(lost_nodes_key(round), 1);
    store_.set(lost_node_key(round, k), cat(group_rank, " ", why));
  } catch (const RpcError&) {
    // A full store: the other nodes' workers notice at their groups' timeout.
  }
  const auto going_on = std::count_if(r.members.begin(), r.members.end(),
                                      [](const Member& other) { return !other.lost; });
  if (lost_observer_) {
    lost_observer_(cat(why, ": left out of round ", round, " (--on_failure=heal); ", going_on,
                       " node(s) go on"));
  }
}

RoundStatus NodeLiveness::lost_status(const Round& r, std::int64_t number, int group_rank) const {
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

// --- Joining the running round (heal) ----------------------------------------

std::optional<JoinTicket> NodeLiveness::admit(Round& running, const NodeInfo& args, TimePoint now) {
  if (std::optional<int> place = place_to_take(running, args)) {
    return take_place(running, *place, args, now);
  }
  return grow_running_round(running, args, now);
}

// A lost place with the joiner's local world size (so that the ranks fit):
// its own when it is that node relaunched, else the one its explicit node
// rank names, else the lowest. A live node's own place too: the node joining
// again proves its old agent gone.
std::optional<int> NodeLiveness::place_to_take(const Round& r, const NodeInfo& args) const {
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

JoinTicket NodeLiveness::take_place(Round& r, int group_rank, const NodeInfo& args, TimePoint now) {
  earliest_round_ = -1;  // a member again where none was live
  const std::string host = quote(host_of(args));
  const std::int64_t round = rounds_.current_round();
  if (store_.add(kHealRelaunchesKey, 0) >= config_.max_restarts) {
    throw refusal(RpcCode::kFailedPrecondition, "host ", host, " cannot take the place of ",
                  describe_node(r, group_rank), " in running round ", round,
                  ": no restarts left for it (--max_restarts=", config_.max_restarts,
                  ", spent on relaunches)");
  }
  store_.add(kHealRelaunchesKey, 1);
  if (!r.members[group_rank].lost) {
    lose(r, group_rank, cat(describe_node(r, group_rank), " was relaunched (a new agent joined)"));
  }
  const std::string was = host_of(r.members[group_rank].args);
  const std::uint64_t id = rounds_.next_id();
  r.members[group_rank] = Member{args, id, id, now, false, false, false};
  const RoundAssignment place = rounds_.answer_joined_running(r, group_rank);
  if (lost_observer_) {
    lost_observer_(cat("host ", host, " takes the place of lost host ", quote(was), " as node ",
                       group_rank, " in running round ", round, " (ranks ",
                       place.global_rank_offset, "-",
                       place.global_rank_offset + args.local_world_size - 1,
                       "; --on_failure=heal): its workers heal from the live ranks"));
  }
  return JoinTicket{id};
}

// One more node, when the round's program heals in process (it said so in
// the store) and the round has room for it.
std::optional<JoinTicket> NodeLiveness::grow_running_round(Round& r, const NodeInfo& args,
                                                           TimePoint now) {
  earliest_round_ = -1;  // one more member
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
  const std::int64_t round = rounds_.current_round();
  if (!store_.get(healing_round_key(round))) return std::nullopt;
  const std::uint64_t id = rounds_.next_id();
  r.members.push_back(Member{args, id, id, now, false, false, false});
  const int world_before = r.common.world_size;
  r.common.group_world_size = size + 1;
  r.common.world_size += args.local_world_size;
  const RoundAssignment place = rounds_.answer_joined_running(r, size);
  if (lost_observer_) {
    lost_observer_(cat("host ", quote(host_of(args)), " joins running round ", round, " as node ",
                       size, " (ranks ", place.global_rank_offset, "-",
                       place.global_rank_offset + args.local_world_size - 1, "; world ",
                       world_before, " -> ", r.common.world_size,
                       "; --on_failure=heal): the live ranks admit its workers"));
  }
  return JoinTicket{id};
}

}  // namespace ddp::launcher
