#include "rendezvous/round_formation.h"

#include <algorithm>

namespace ddp::launcher {
namespace {

// Who a joiner is across its retries.
std::string identity_of(const NodeInfo& args) {
  return cat(args.hostname, '\n', args.address, '\n', args.node_rank);
}

// The head of a (possibly multi-line, 27 KB) failure report, for one line.
std::string first_line(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  if (line.size() > 300) line = line.substr(0, 297) + "...";
  return line;
}

RoundAssignment assignment_of(const Round& r, int group_rank) {
  RoundAssignment a = r.common;
  a.group_rank = group_rank;
  a.member = r.members[group_rank].ticket;
  for (int g = 0; g < group_rank; ++g) a.global_rank_offset += r.members[g].args.local_world_size;
  return a;
}

}  // namespace

RendezvousPhase RoundFormation::phase() const {
  if (rounds_.empty()) return RendezvousPhase::kForming;
  const Round& last = rounds_.back();
  if (!last.ended) return RendezvousPhase::kRunning;
  if (last.succeeded) return RendezvousPhase::kSucceeded;
  return last.can_restart ? RendezvousPhase::kForming : RendezvousPhase::kFailed;
}

void RoundFormation::fail_forming(const RpcError& why) {
  // Remembered: a node of the job that joins later hears it too.
  misconfigured_ = why;
  discard_round(why);
}

JoinTicket RoundFormation::join(const NodeInfo& args, TimePoint now, const HealAdmission& heal) {
  const std::string host = cat("host ", quote(host_of(args)));
  if (args.local_world_size < 1) {
    throw refusal(RpcCode::kInvalidArgument, "local world size ", args.local_world_size, " of ",
                  host, " must be at least 1");
  }
  if (args.node_rank < -1 || args.node_rank >= config_.max_nodes) {
    throw refusal(RpcCode::kInvalidArgument, "node rank ", args.node_rank, " of ", host,
                  " is outside [0, ", config_.max_nodes, ") for ", nnodes_flag(config_));
  }
  waiting_for_place_.erase(identity_of(args));  // it hears the answer now
  if (phase() == RendezvousPhase::kRunning) {
    if (std::optional<JoinTicket> admitted = admit_during_round(args, now, heal)) return *admitted;
  }
  switch (phase()) {
    case RendezvousPhase::kSucceeded:
      throw refusal(RpcCode::kFailedPrecondition, "run ", quote(config_.run_id),
                    " has already completed");
    case RendezvousPhase::kFailed:
      throw refusal(RpcCode::kFailedPrecondition, "run ", quote(config_.run_id),
                    " failed with no restarts left (max ", config_.max_restarts,
                    "): ", rounds_.back().reason);
    case RendezvousPhase::kRunning:  // not here: admit_during_round() ended the round or threw
    case RendezvousPhase::kForming:
      break;
  }
  if (std::optional<RpcError> why = forming_.rank_conflict(args)) {
    // Two nodes of one job claim a rank: a configuration error that no
    // waiting can fix, so every joiner hears of it now.
    fail_forming(*why);
    throw *why;
  }
  forming_.add(args, next_id_, now);  // may refuse: the id is taken only after
  const std::uint64_t id = next_id_++;
  join_tickets_[id] = std::monostate{};
  ++changes_;
  maybe_close_round(now);  // closes at once when this was the max_nodes-th join
  return JoinTicket{id};
}

// A join while a round runs. Under heal it may take a lost node's place.
// Else the node may be one of the round's own,
// relaunched after its agent died (same explicit node rank, or same host and
// address for an assigned rank): the round has lost that agent, so it ends
// as a failure (one restart) and the node joins the next. Else, an elastic
// round with room grows: it ends without using a restart and the next round
// takes the newcomer (torchrun's scale-up). A full round keeps running and the
// node is told to wait (kUnavailable: the agent asks again).
std::optional<JoinTicket> RoundFormation::admit_during_round(const NodeInfo& args, TimePoint now,
                                                             const HealAdmission& heal) {
  Round& running = rounds_.back();
  const int size = static_cast<int>(running.members.size());
  for (int i = 0; i < size; ++i) {
    const Member& member = running.members[i];
    const NodeInfo& was = member.args;
    const bool same_rank = args.node_rank >= 0 && was.node_rank == args.node_rank;
    const bool same_host = was.hostname == args.hostname && was.address == args.address;
    // Another host claiming the rank of a node that heartbeats: two live
    // agents with one --node_rank, not a relaunch. Ending the round would let
    // each end the other's rounds until the restarts run out; the newcomer
    // is told at once and waits (it gets the rank if the holder is lost).
    if (same_rank && !same_host && !member.left &&
        now < member.last_seen + config_.heartbeat_timeout / 2) {
      waiting_for_place_.insert(identity_of(args));
      throw refusal(RpcCode::kUnavailable, "node rank ", args.node_rank, " is held by host ",
                    quote(host_of(was)), ", which is alive (heard from ",
                    seconds(now - member.last_seen), " ago): host ", quote(host_of(args)),
                    " waits for it; give each node its own --node_rank");
    }
  }
  if (heal) {
    if (std::optional<JoinTicket> admitted = heal(running)) return admitted;
  }
  for (int i = 0; i < size; ++i) {
    if (!running.members[i].left && same_node(running.members[i].args, args)) {
      end_round(running,
                cat(describe_node(running, i), " was relaunched (a new agent joined in its place)"),
                true);
      return std::nullopt;
    }
  }
  if (size < config_.max_nodes) {
    end_round(running,
              cat("scale-up: host ", quote(host_of(args)), " arrived while round ", current_round(),
                  " ran with ", size, " of at most ", config_.max_nodes, " nodes"),
              false);
    return std::nullopt;
  }
  waiting_for_place_.insert(identity_of(args));  // owed an answer: see outcome_delivered()
  throw RpcError(
      RpcCode::kUnavailable,
      cat("round ", current_round(), " is full (", size, " nodes, ", nnodes_flag(config_),
          "): host ", quote(host_of(args)), " waits for a place in a later round"),
      kReasonRoundFull);
}

void RoundFormation::maybe_close_round(TimePoint now) {
  switch (forming_.due(now)) {
    case FormingRound::Due::kClose:
      return close_round(now);
    case FormingRound::Due::kDiscard:
      return discard_round(forming_.timeout_refusal());
    case FormingRound::Due::kNothing:
      return;
  }
}

void RoundFormation::close_round(TimePoint now) {
  if (std::optional<RpcError> why = forming_.misfit()) return discard_round(*why);
  Round round;
  round.members = forming_.close(now);
  RoundAssignment& common = round.common;
  common.round = current_round() + 1;
  common.group_world_size = static_cast<int>(round.members.size());
  common.world_size = 0;
  for (const Member& m : round.members) common.world_size += m.args.local_world_size;
  const NodeInfo& master = round.members.front().args;
  common.master_addr = master.address.empty() ? master.hostname : master.address;
  common.master_port = master.master_port;
  common.restart_count = restarts_used_;
  common.reason = last_end_reason_;
  rounds_.push_back(std::move(round));
  const Round& formed = rounds_.back();
  for (int g = 0; g < static_cast<int>(formed.members.size()); ++g) {
    join_tickets_[formed.members[g].ticket] = assignment_of(formed, g);
  }
  ++changes_;
  if (round_observer_) round_observer_(current_round());
}

void RoundFormation::discard_round(const RpcError& why) {
  for (const Member& m : forming_.take()) join_tickets_[m.ticket] = why;
  ++changes_;
}

std::optional<RoundAssignment> RoundFormation::join_status(JoinTicket ticket) {
  auto it = join_tickets_.find(ticket.id);
  if (it == join_tickets_.end()) {
    throw refusal(RpcCode::kNotFound, "unknown join ticket ", ticket.id);
  }
  if (std::holds_alternative<std::monostate>(it->second)) return std::nullopt;
  JoinAnswer answer = std::move(it->second);
  join_tickets_.erase(it);
  if (auto* refused = std::get_if<RpcError>(&answer)) throw *refused;
  return std::get<RoundAssignment>(std::move(answer));
}

void RoundFormation::cancel(JoinTicket ticket) {
  auto it = join_tickets_.find(ticket.id);
  if (it == join_tickets_.end()) return;
  const bool pending = std::holds_alternative<std::monostate>(it->second);
  join_tickets_.erase(it);
  if (!pending) return;
  forming_.remove(ticket.id);
  ++changes_;
}

Round& RoundFormation::find_member(std::int64_t round, int group_rank) {
  if (round < 1 || round > current_round()) {
    throw refusal(RpcCode::kNotFound, "round ", round,
                  " does not exist (rounds formed so far: ", current_round(), ")");
  }
  Round& r = rounds_[round - 1];
  if (group_rank < 0 || group_rank >= static_cast<int>(r.members.size())) {
    throw refusal(RpcCode::kInvalidArgument, "group rank ", group_rank, " is not in round ", round,
                  ", which has ", r.members.size(), " nodes");
  }
  return r;
}

Round* RoundFormation::running() {
  return rounds_.empty() || rounds_.back().ended ? nullptr : &rounds_.back();
}

const Round* RoundFormation::running() const {
  return rounds_.empty() || rounds_.back().ended ? nullptr : &rounds_.back();
}

RoundAssignment RoundFormation::answer_joined_running(const Round& round, int group_rank) {
  RoundAssignment place = assignment_of(round, group_rank);
  place.joined_running = true;
  join_tickets_[place.member] = place;
  ++changes_;
  return place;
}

void RoundFormation::end_round(Round& round, std::string reason, bool uses_restart) {
  if (round.ended) return;
  round.ended = true;
  round.reason = std::move(reason);
  round.can_restart = !uses_restart || restarts_used_ < config_.max_restarts;
  if (uses_restart && round.can_restart) ++restarts_used_;
  last_end_reason_ = first_line(round.reason);
  ++changes_;
}

bool RoundFormation::outcome_delivered() const {
  if (rounds_.empty() || !rounds_.back().ended) return false;
  if (!waiting_for_place_.empty()) return false;  // they ask again each second
  const auto& members = rounds_.back().members;
  return std::all_of(members.begin(), members.end(), [](const Member& m) { return m.informed; });
}

std::string RoundFormation::broken_invariant() const {
  if (restarts_used_ > config_.max_restarts)
    return cat(restarts_used_, " restarts used, over max_restarts");
  if (std::string why = forming_.broken_invariant(); !why.empty()) return why;
  for (std::size_t i = 0; i < rounds_.size(); ++i) {
    const Round& r = rounds_[i];
    if (r.members.empty() || static_cast<int>(r.members.size()) > config_.max_nodes) {
      return cat("round ", i + 1, " has ", r.members.size(), " nodes");
    }
    if (i + 1 < rounds_.size() && !rounds_[i].ended)
      return cat("round ", i + 1, " never ended but a later one formed");
    if (r.succeeded && !r.ended) return cat("round ", i + 1, " succeeded without ending");
    for (const Member& m : r.members) {
      if (m.lost && (!m.left || !m.informed || !config_.heal))
        return cat("round ", i + 1, ": a lost node is not left and informed under heal");
    }
    for (std::size_t g = 0; g < r.members.size(); ++g) {
      const int explicit_rank = r.members[g].args.node_rank;
      if (explicit_rank >= 0 && explicit_rank != static_cast<int>(g)) {
        return cat("round ", i + 1, ": node rank ", explicit_rank, " got group rank ", g);
      }
    }
  }
  return "";
}

}  // namespace ddp::launcher
