#include "rendezvous/rendezvous_state.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <tuple>
#include <type_traits>

#include "ddp/common/error.h"
#include "rendezvous/messages.h"

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

// Compares every byte whatever the first difference, so response time does
// not reveal how much of a guessed token was right.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ (i < b.size() ? b[i] : 0);
  return diff == 0;
}

}  // namespace

RendezvousState::RendezvousState(RendezvousConfig config) : config_(std::move(config)) {
  const RendezvousConfig& c = config_;
  auto require = [](bool ok, const std::string& what) {
    if (!ok) throw Error("rendezvous config: " + what);
  };
  require(!c.run_id.empty(), "the run id must not be empty");
  require(c.min_nodes >= 1, cat("min nodes ", c.min_nodes, " must be at least 1"));
  require(c.max_nodes >= c.min_nodes,
          cat("max nodes ", c.max_nodes, " is below min nodes ", c.min_nodes));
  require(c.max_restarts >= 0, cat("max restarts ", c.max_restarts, " must not be negative"));
  // A year bounds the timeouts so that deadline arithmetic cannot overflow.
  auto timeout = [&](const char* name, std::chrono::milliseconds value, bool zero_ok) {
    const bool ok =
        (zero_ok ? value.count() >= 0 : value.count() > 0) && value <= std::chrono::hours(24 * 365);
    require(ok, cat("the ", name, " timeout of ", value.count(), " ms is outside ",
                    zero_ok ? "[" : "(", "0, 1 year]"));
  };
  timeout("join", c.join_timeout, false);
  timeout("heartbeat", c.heartbeat_timeout, false);
  timeout("last call", c.last_call_timeout, true);
  require(c.limits.max_world_size >= 1, "max world size must be at least 1");
}

RendezvousState::Phase RendezvousState::phase() const {
  if (rounds_.empty()) return Phase::kForming;
  const Round& last = rounds_.back();
  if (!last.ended) return Phase::kRunning;
  if (last.succeeded) return Phase::kSucceeded;
  return last.can_restart ? Phase::kForming : Phase::kFailed;
}

std::string RendezvousState::nnodes_flag() const {
  const int lo = config_.min_nodes, hi = config_.max_nodes;
  return lo == hi ? cat("--nnodes=", lo) : cat("--nnodes=", lo, ":", hi);
}

void RendezvousState::check_auth(const Auth& auth) const {
  if (config_.token.empty()) {
    if (!auth.token.empty()) {
      throw refusal(RpcCode::kUnauthenticated,
                    "this node has a rendezvous token but the rendezvous runs without one: give "
                    "every node the same DDP_RDZV_TOKEN (or --rdzv_token), or none");
    }
  } else if (!same_secret(auth.token, config_.token)) {
    throw refusal(RpcCode::kUnauthenticated,
                  auth.token.empty() ? "missing rendezvous token: the rendezvous requires one (set "
                                       "DDP_RDZV_TOKEN or --rdzv_token on every node)"
                                     : "wrong rendezvous token");
  }
  if (auth.run_id != config_.run_id) {
    throw refusal(RpcCode::kInvalidArgument, "run id ", quote(auth.run_id),
                  " does not match this server's run ", quote(config_.run_id));
  }
}

// --- Membership and rounds --------------------------------------------------

JoinTicket RendezvousState::join(const Auth& auth, const NodeInfo& args, TimePoint now) {
  try {
    check_auth(auth);
  } catch (const RpcError& refused) {
    // A misconfigured node of this job (another run id, or a token where the
    // server has none) fails the forming round at once: the others would
    // otherwise wait out the join timeout for a node that cannot come. Only
    // for requests the server cannot take for an intruder's: with a token
    // configured, a request without it is refused and changes nothing.
    if (!refused.is(RpcCode::kUnauthenticated) || config_.token.empty()) {
      fail_forming_for(refused, host_of(args));
    }
    throw;
  }
  if (misconfigured_) throw *misconfigured_;
  tick(now);
  const std::string host = cat("host ", quote(host_of(args)));
  if (args.local_world_size < 1) {
    throw refusal(RpcCode::kInvalidArgument, "local world size ", args.local_world_size, " of ",
                  host, " must be at least 1");
  }
  if (args.node_rank < -1 || args.node_rank >= config_.max_nodes) {
    throw refusal(RpcCode::kInvalidArgument, "node rank ", args.node_rank, " of ", host,
                  " is outside [0, ", config_.max_nodes, ") for ", nnodes_flag());
  }
  waiting_for_place_.erase(identity_of(args));  // it hears the answer now
  if (phase() == Phase::kRunning) {
    if (std::optional<JoinTicket> admitted = admit_during_round(args, now)) return *admitted;
  }
  switch (phase()) {
    case Phase::kSucceeded:
      throw refusal(RpcCode::kFailedPrecondition, "run ", quote(config_.run_id),
                    " has already completed");
    case Phase::kFailed:
      throw refusal(RpcCode::kFailedPrecondition, "run ", quote(config_.run_id),
                    " failed with no restarts left (max ", config_.max_restarts,
                    "): ", rounds_.back().reason);
    case Phase::kRunning:  // not here: admit_during_round() ended the round or threw
    case Phase::kForming:
      break;
  }
  std::int64_t world_size = args.local_world_size;
  for (const Member& m : forming_.members) {
    if (args.node_rank >= 0 && m.args.node_rank == args.node_rank) {
      // Two nodes of one job claim a rank: a configuration error that no
      // waiting can fix, so every joiner hears of it now.
      RpcError why =
          refusal(RpcCode::kInvalidArgument, "node rank ", args.node_rank,
                  " was given to two nodes: host ", quote(host_of(m.args)), " and ", host,
                  "; give each node its own --node_rank (or none, for assigned ranks)");
      fail_forming(why);
      throw why;
    }
    world_size += m.args.local_world_size;
  }
  if (world_size > config_.limits.max_world_size) {
    throw refusal(RpcCode::kResourceExhausted, host, " cannot join: the world size would be ",
                  world_size, ", limit ", config_.limits.max_world_size);
  }
  const std::uint64_t id = next_id_++;
  if (forming_.members.empty()) forming_.first_join = now;
  forming_.members.push_back(Member{args, id, id, now, false});
  if (forming_.members.size() == static_cast<std::size_t>(config_.min_nodes))
    forming_.min_reached = now;
  join_tickets_[id] = std::monostate{};
  changed();
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
std::optional<JoinTicket> RendezvousState::admit_during_round(const NodeInfo& args, TimePoint now) {
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
  if (config_.heal) {
    if (std::optional<int> place = place_to_take(running, args)) {
      return take_place(running, *place, args, now);
    }
    if (std::optional<JoinTicket> grown = grow_running_round(running, args, now)) return grown;
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
  throw RpcError(RpcCode::kUnavailable,
                 cat("round ", current_round(), " is full (", size, " nodes, ", nnodes_flag(),
                     "): host ", quote(host_of(args)), " waits for a place in a later round"),
                 kReasonRoundFull);
}

void RendezvousState::fail_forming_for(const RpcError& why, const std::string& host) {
  if (phase() != Phase::kForming) return;
  fail_forming(RpcError(why.code(), cat("host ", quote(host), " was refused: ", why.what())));
}

void RendezvousState::fail_forming(const RpcError& why) {
  // Remembered: a node of the job that joins later hears it too.
  misconfigured_ = why;
  discard_round(why);
}

// The round closes at MAX nodes, or at the end of its last call; it must do
// so within join_timeout of its first join (as torch 2.x's c10d handler's
// deadline), else it is discarded and every joiner hears why.
void RendezvousState::maybe_close_round(TimePoint now) {
  const auto n = static_cast<int>(forming_.members.size());
  if (n == 0) return;
  const TimePoint join_deadline = forming_.first_join + config_.join_timeout;
  const TimePoint last_call_end = forming_.min_reached + config_.last_call_timeout;
  if (n >= config_.max_nodes ||
      (n >= config_.min_nodes && now >= last_call_end && last_call_end <= join_deadline)) {
    close_round(now);
  } else if (now >= join_deadline) {
    discard_round(refusal(RpcCode::kDeadlineExceeded, join_timeout_message()));
  }
}

// The joined hosts, quoted: "'a', 'b'".
std::string RendezvousState::forming_hosts() const {
  std::string hosts;
  for (const Member& m : forming_.members) {
    hosts += cat(hosts.empty() ? "" : ", ", quote(host_of(m.args)));
  }
  return hosts;
}

// "rendezvous join timed out after 5.0s (--rdzv_conf join_timeout, ...): "
// then either "1 of 2 nodes joined (--nnodes=2; missing node rank 1; joined:
// 'a')", the missing ranks being those of [0, min_nodes) still free once the
// automatic nodes take the lowest free ones; or, with MIN in, the last call
// that would have ended after the deadline.
std::string RendezvousState::join_timeout_message() const {
  const std::string head = cat("rendezvous join timed out after ", seconds(config_.join_timeout),
                               " (--rdzv_conf join_timeout, or timeout in the static form): ");
  const auto joined = static_cast<int>(forming_.members.size());
  if (joined >= config_.min_nodes) {
    return cat(head, joined, " of at most ", config_.max_nodes, " nodes joined (", nnodes_flag(),
               "; joined: ", forming_hosts(),
               ") and the round was still in its last call for more, ", "which ends ",
               seconds(config_.last_call_timeout), " after the minimum of ", config_.min_nodes,
               " node(s) had joined (--rdzv_conf last_call_timeout): give a join_timeout longer "
               "than the last call");
  }
  std::vector<bool> taken(config_.max_nodes, false);
  int automatic = 0;
  for (const Member& m : forming_.members) {
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
  return cat(head, joined, " of ", config_.min_nodes, " nodes joined (", nnodes_flag(),
             "; missing node ", format_ranks(missing), "; joined: ", forming_hosts(), ")");
}

void RendezvousState::close_round(TimePoint now) {
  const std::vector<Member>& joined = forming_.members;
  const auto n = static_cast<int>(joined.size());
  std::vector<int> slot(n, -1);  // group rank -> index in `joined`
  std::vector<int> automatic;
  for (int i = 0; i < n; ++i) {
    const int rank = joined[i].args.node_rank;
    if (rank >= n) {
      return discard_round(refusal(RpcCode::kAborted, "node rank ", rank, " (host ",
                                   quote(host_of(joined[i].args)),
                                   ") does not fit: the round closed with ", n, " nodes (",
                                   nnodes_flag(), "), so node ranks must be below ", n));
    }
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
  Round round;
  for (int& s : slot) {
    if (s < 0) s = *next_auto++;
    round.members.push_back(joined[s]);
    round.members.back().last_seen = now;  // the round's start counts as a heartbeat
  }

  RoundAssignment result;
  result.round = current_round() + 1;
  result.group_world_size = n;
  result.world_size = 0;
  for (const Member& m : round.members) result.world_size += m.args.local_world_size;
  const NodeInfo& master = round.members.front().args;
  result.master_addr = master.address.empty() ? master.hostname : master.address;
  result.master_port = master.master_port;
  result.restart_count = restarts_used_;
  result.reason = last_end_reason_;
  round.common = result;
  rounds_.push_back(std::move(round));
  const Round& formed = rounds_.back();
  for (int g = 0; g < n; ++g) join_tickets_[formed.members[g].ticket] = assignment_of(formed, g);
  forming_ = {};
  changed();
  if (round_observer_) round_observer_(current_round());
}

void RendezvousState::discard_round(const RpcError& why) {
  for (const Member& m : forming_.members) join_tickets_[m.ticket] = why;
  forming_ = {};
  changed();
}

std::optional<RoundAssignment> RendezvousState::join_status(JoinTicket ticket, TimePoint now) {
  tick(now);
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

void RendezvousState::cancel(JoinTicket ticket) {
  auto it = join_tickets_.find(ticket.id);
  if (it == join_tickets_.end()) return;
  const bool pending = std::holds_alternative<std::monostate>(it->second);
  join_tickets_.erase(it);
  if (!pending) return;
  // Dropping below min_nodes stops the last call; the next min-th join restarts it.
  std::erase_if(forming_.members, [&](const Member& m) { return m.ticket == ticket.id; });
  changed();
}

RendezvousState::Round& RendezvousState::find_member(std::int64_t round, int group_rank) {
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

std::string RendezvousState::describe_node(const Round& round, int group_rank) const {
  return cat("node ", group_rank, " (host ", quote(host_of(round.members[group_rank].args)), ")");
}

void RendezvousState::end_round(Round& round, std::string reason, bool uses_restart) {
  if (round.ended) return;
  round.ended = true;
  round.reason = std::move(reason);
  round.can_restart = !uses_restart || restarts_used_ < config_.max_restarts;
  if (uses_restart && round.can_restart) ++restarts_used_;
  last_end_reason_ = first_line(round.reason);
  changed();
}

RoundStatus RendezvousState::heartbeat(const Auth& auth, std::int64_t round, int group_rank,
                                       TimePoint now, bool heard_end, std::uint64_t member) {
  check_auth(auth);
  tick(now);
  Round& r = find_member(round, group_rank);
  if (r.members[group_rank].lost || replaced(r, group_rank, member)) {
    return lost_status(r, group_rank);
  }
  if (r.ended) {
    if (heard_end) r.members[group_rank].informed = true;
    return RoundStatus{true, r.succeeded, r.can_restart, r.reason};
  }
  r.members[group_rank].last_seen = now;
  return RoundStatus{};
}

std::optional<RoundStatus> RendezvousState::round_end(std::int64_t round, int group_rank,
                                                      TimePoint now, std::uint64_t member) {
  tick(now);
  try {
    const Round& r = find_member(round, group_rank);
    if (r.members[group_rank].lost || replaced(r, group_rank, member)) {
      return lost_status(r, group_rank);
    }
    if (!r.ended) return std::nullopt;
    return RoundStatus{true, r.succeeded, r.can_restart, r.reason};
  } catch (const RpcError& gone) {
    return RoundStatus{true, false, false, gone.what()};
  }
}

bool RendezvousState::outcome_delivered() const {
  if (rounds_.empty() || !rounds_.back().ended) return false;
  if (!waiting_for_place_.empty()) return false;  // they ask again each second
  const auto& members = rounds_.back().members;
  return std::all_of(members.begin(), members.end(), [](const Member& m) { return m.informed; });
}

bool RendezvousState::report_failure(const Auth& auth, std::int64_t round, int group_rank,
                                     const std::string& report, int exit_code, TimePoint now,
                                     std::uint64_t member) {
  check_auth(auth);
  tick(now);
  Round& r = find_member(round, group_rank);
  // The others went on without it.
  if (r.members[group_rank].lost || replaced(r, group_rank, member)) return false;
  r.members[group_rank].informed = true;  // the reporter knows
  end_round(r, !report.empty() ? report
                               : cat(describe_node(r, group_rank),
                                     " reported a failure, exit code ", exit_code));
  return r.can_restart;
}

void RendezvousState::leave(const Auth& auth, std::int64_t round, int group_rank, int exit_code,
                            TimePoint now, std::uint64_t member) {
  check_auth(auth);
  tick(now);
  Round& r = find_member(round, group_rank);
  if (r.members[group_rank].left || replaced(r, group_rank, member)) return;
  r.members[group_rank].left = true;
  if (exit_code != 0) {
    r.members[group_rank].informed = true;  // it failed: it knows
    end_round(r, cat(describe_node(r, group_rank), " left with exit code ", exit_code));
  } else if (!r.ended && std::all_of(r.members.begin(), r.members.end(),
                                     [](const Member& m) { return m.left; })) {
    r.ended = r.succeeded = true;
  }
  changed();
}

void RendezvousState::expire_heartbeats(TimePoint now) {
  if (rounds_.empty() || rounds_.back().ended) return;
  Round& r = rounds_.back();
  int silent = -1;  // the longest silent node, the lowest group rank on ties
  for (int i = 0; i < static_cast<int>(r.members.size()); ++i) {
    Member& m = r.members[i];
    if (m.left || now < m.last_seen + config_.heartbeat_timeout) continue;
    m.informed = true;  // gone: nobody to tell
    if (silent < 0 || m.last_seen < r.members[silent].last_seen) silent = i;
  }
  if (silent < 0) return;
  if (config_.heal) return lose_silent_nodes(r, now);
  end_round(r, cat(describe_node(r, silent), " stopped sending heartbeats for ",
                   seconds(now - r.members[silent].last_seen)));
}

// --- Time ----------------------------------------------------------------------

void RendezvousState::tick(TimePoint now) {
  maybe_close_round(now);
  expire_heartbeats(now);
  barriers_.expire(now);
}

std::optional<TimePoint> RendezvousState::next_deadline() const {
  std::optional<TimePoint> next;
  auto consider = [&](TimePoint t) {
    if (!next || t < *next) next = t;
  };
  const auto joined = static_cast<int>(forming_.members.size());
  if (joined >= config_.min_nodes) consider(forming_.min_reached + config_.last_call_timeout);
  if (joined > 0) consider(forming_.first_join + config_.join_timeout);
  if (!rounds_.empty() && !rounds_.back().ended) {
    for (const Member& m : rounds_.back().members) {
      if (!m.left) consider(m.last_seen + config_.heartbeat_timeout);
    }
  }
  if (auto barrier = barriers_.next_deadline()) consider(*barrier);
  return next;
}

std::string RendezvousState::broken_invariant() const {
  if (std::string why = store_.broken_invariant(); !why.empty()) return why;
  if (std::string why = barriers_.broken_invariant(); !why.empty()) return why;
  if (restarts_used_ > config_.max_restarts)
    return cat(restarts_used_, " restarts used, over max_restarts");
  if (static_cast<int>(forming_.members.size()) > config_.max_nodes) {
    return cat("forming round has ", forming_.members.size(), " nodes, over max_nodes");
  }
  std::set<int> claimed;
  for (const Member& m : forming_.members) {
    if (m.args.node_rank >= 0 && !claimed.insert(m.args.node_rank).second) {
      return cat("node rank ", m.args.node_rank, " twice in the forming round");
    }
  }
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
