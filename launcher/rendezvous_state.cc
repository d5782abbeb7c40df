#include "rendezvous_state.h"

#include <algorithm>
#include <charconv>
#include <cstdio>

#include "ddp/common/error.h"

namespace ddp::launcher {
namespace {

Status error(Code code, std::string message) { return {code, std::move(message)}; }

std::string seconds(std::chrono::nanoseconds d) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1fs", std::chrono::duration<double>(d).count());
  return text;
}

// A key, name or value as it appears in a message: quoted, at most 40 bytes,
// non-printable bytes escaped (keys may be binary).
std::string quote(const std::string& text) {
  std::string out = "'";
  for (std::size_t i = 0; i < text.size() && i < 40; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return out + (text.size() > 40 ? "...'" : "'");
}

std::string host_of(const JoinArgs& args) {
  return args.hostname.empty() ? args.address : args.hostname;
}

// "rank 3" / "ranks 0-2, 5" from inclusive ranges; long lists are cut, since
// a barrier may span a million ranks.
std::string format_ranks(const std::vector<std::pair<int, int>>& ranges, long count) {
  std::string out = count == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    if (i == 16) return out + ", ... (" + std::to_string(count) + " in all)";
    if (i > 0) out += ", ";
    out += std::to_string(ranges[i].first);
    if (ranges[i].second > ranges[i].first) out += "-" + std::to_string(ranges[i].second);
  }
  return out;
}

std::string format_ranks(const std::vector<int>& sorted) {
  std::vector<std::pair<int, int>> ranges;
  for (int r : sorted) {
    if (!ranges.empty() && ranges.back().second + 1 == r) {
      ranges.back().second = r;
    } else {
      ranges.emplace_back(r, r);
    }
  }
  return format_ranks(ranges, static_cast<long>(sorted.size()));
}

// Compares every byte whatever the first difference, so response time does
// not reveal how much of a guessed token was right.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ (i < b.size() ? b[i] : 0);
  return diff == 0;
}

}  // namespace

const char* code_name(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kUnauthenticated: return "UNAUTHENTICATED";
    case Code::kInvalidArgument: return "INVALID_ARGUMENT";
    case Code::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case Code::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case Code::kNotFound: return "NOT_FOUND";
    case Code::kFailedPrecondition: return "FAILED_PRECONDITION";
    case Code::kAborted: return "ABORTED";
  }
  return "UNKNOWN";
}

RendezvousState::RendezvousState(RendezvousConfig config) : config_(std::move(config)) {
  const auto& c = config_;
  if (c.min_nodes < 1) throw Error("rendezvous: min nodes must be at least 1, got " + std::to_string(c.min_nodes));
  if (c.max_nodes < c.min_nodes) {
    throw Error("rendezvous: max nodes " + std::to_string(c.max_nodes) + " is below min nodes " +
                std::to_string(c.min_nodes));
  }
  if (c.join_timeout.count() <= 0 || c.heartbeat_timeout.count() <= 0 || c.last_call_timeout.count() < 0) {
    throw Error("rendezvous: join and heartbeat timeouts must be positive, the last call timeout not negative");
  }
  if (c.max_restarts < 0) throw Error("rendezvous: max restarts must not be negative, got " + std::to_string(c.max_restarts));
}

RendezvousState::Phase RendezvousState::phase() const {
  if (rounds_.empty()) return Phase::kForming;
  const Round& last = rounds_.back();
  if (!last.ended) return Phase::kRunning;
  if (last.succeeded) return Phase::kSucceeded;
  return last.can_restart ? Phase::kForming : Phase::kFailed;
}

std::string RendezvousState::nnodes_flag() const {
  std::string flag = "--nnodes=" + std::to_string(config_.min_nodes);
  if (config_.max_nodes != config_.min_nodes) flag += ":" + std::to_string(config_.max_nodes);
  return flag;
}

Status RendezvousState::check_auth(const Auth& auth) const {
  if (!same_secret(auth.token, config_.token)) {
    return error(Code::kUnauthenticated, "wrong or missing rendezvous token");
  }
  if (auth.run_id != config_.run_id) {
    return error(Code::kInvalidArgument, "run id " + quote(auth.run_id) + " does not match this server's run " +
                                             quote(config_.run_id));
  }
  return {};
}

// --- Membership and rounds --------------------------------------------------

Result<JoinTicket> RendezvousState::join(const Auth& auth, const JoinArgs& args, TimePoint now) {
  if (Status s = check_auth(auth); !s.ok()) return {s};
  tick(now);
  const std::string host = quote(host_of(args));
  if (args.local_world_size < 1) {
    return {error(Code::kInvalidArgument, "local world size " + std::to_string(args.local_world_size) +
                                              " of host " + host + " must be at least 1")};
  }
  if (args.node_rank < -1 || args.node_rank >= config_.max_nodes) {
    return {error(Code::kInvalidArgument, "node rank " + std::to_string(args.node_rank) + " of host " + host +
                                              " is outside [0, " + std::to_string(config_.max_nodes) +
                                              ") for " + nnodes_flag())};
  }
  switch (phase()) {
    case Phase::kSucceeded:
      return {error(Code::kFailedPrecondition, "run " + quote(config_.run_id) + " has already completed")};
    case Phase::kFailed:
      return {error(Code::kFailedPrecondition, "run " + quote(config_.run_id) + " failed with no restarts left (max " +
                                                   std::to_string(config_.max_restarts) +
                                                   "): " + rounds_.back().reason)};
    case Phase::kRunning: {
      const std::string round = "round " + std::to_string(rounds_.size());
      const auto size = rounds_.back().members.size();
      if (size >= static_cast<std::size_t>(config_.max_nodes)) {
        return {error(Code::kResourceExhausted, "host " + host + " cannot join: more nodes than " + nnodes_flag() +
                                                    " (" + round + " already has " + std::to_string(size) + ")")};
      }
      return {error(Code::kFailedPrecondition, "host " + host + " cannot join: " + round + " is already running with " +
                                                   std::to_string(size) +
                                                   " nodes; nodes join the next round after a restart")};
    }
    case Phase::kForming: break;
  }
  for (const Member& m : forming_.members) {
    if (args.node_rank >= 0 && m.args.node_rank == args.node_rank) {
      return {error(Code::kInvalidArgument, "node rank " + std::to_string(args.node_rank) + " already joined (host " +
                                                quote(host_of(m.args)) + "); host " + host + " cannot take it")};
    }
  }
  // Unreachable while max_nodes closes the round at once; kept as a guard.
  if (forming_.members.size() >= static_cast<std::size_t>(config_.max_nodes)) {
    return {error(Code::kResourceExhausted, "host " + host + " cannot join: more nodes than " + nnodes_flag())};
  }
  const std::uint64_t id = next_id_++;
  if (forming_.members.empty()) forming_.first_join = now;
  forming_.members.push_back(Member{args, id, id, now, false});
  if (forming_.members.size() == static_cast<std::size_t>(config_.min_nodes)) forming_.min_reached = now;
  join_tickets_[id] = std::nullopt;
  changed();
  maybe_close_round(now);
  return {{}, JoinTicket{id}};
}

void RendezvousState::maybe_close_round(TimePoint now) {
  const auto n = static_cast<int>(forming_.members.size());
  if (n == 0) return;
  if (n >= config_.max_nodes || (n >= config_.min_nodes && now >= forming_.min_reached + config_.last_call_timeout)) {
    close_round(now);
  } else if (n < config_.min_nodes && now >= forming_.first_join + config_.join_timeout) {
    discard_round(error(Code::kDeadlineExceeded, join_timeout_message()));
  }
}

// "1 of 2 nodes joined (missing node ranks 1; joined: 'a')": the missing ranks
// are those of [0, min_nodes) left once automatic nodes take the lowest free.
std::string RendezvousState::join_timeout_message() const {
  std::vector<bool> taken(config_.max_nodes, false);
  int automatic = 0;
  std::string hosts;
  for (const Member& m : forming_.members) {
    if (m.args.node_rank >= 0) taken[m.args.node_rank] = true; else ++automatic;
    hosts += (hosts.empty() ? "" : ", ") + quote(host_of(m.args));
  }
  std::vector<int> missing;
  for (int r = 0; r < config_.min_nodes; ++r) {
    if (taken[r]) continue;
    if (automatic > 0) --automatic; else missing.push_back(r);
  }
  return "rendezvous join timed out after " + seconds(config_.join_timeout) + ": " +
         std::to_string(forming_.members.size()) + " of " + std::to_string(config_.min_nodes) + " nodes joined (" +
         nnodes_flag() + "; missing node " + format_ranks(missing) + "; joined: " + hosts + ")";
}

void RendezvousState::close_round(TimePoint now) {
  std::vector<Member>& joined = forming_.members;
  const auto n = static_cast<int>(joined.size());
  std::vector<int> slot(n, -1);  // group rank -> index in `joined`
  std::vector<int> automatic;
  for (int i = 0; i < n; ++i) {
    const int rank = joined[i].args.node_rank;
    if (rank < 0) {
      automatic.push_back(i);
    } else if (rank >= n) {
      return discard_round(error(
          Code::kAborted, "node rank " + std::to_string(rank) + " (host " + quote(host_of(joined[i].args)) +
                              ") does not fit: round closed with " + std::to_string(n) + " nodes (" + nnodes_flag() +
                              "), so node ranks must be below " + std::to_string(n)));
    } else {
      slot[rank] = i;
    }
  }
  std::sort(automatic.begin(), automatic.end(), [&](int a, int b) {
    const JoinArgs &x = joined[a].args, &y = joined[b].args;
    return std::tie(x.hostname, x.address, joined[a].arrival) < std::tie(y.hostname, y.address, joined[b].arrival);
  });
  auto next = automatic.begin();
  for (int& s : slot) {
    if (s < 0) s = *next++;
  }

  Round round;
  for (int i : slot) {
    round.members.push_back(joined[i]);
    round.members.back().last_seen = now;  // the round's start counts as a heartbeat
  }
  rounds_.push_back(std::move(round));
  forming_ = {};

  const Round& r = rounds_.back();
  JoinResult result;
  result.round = static_cast<std::int64_t>(rounds_.size());
  result.group_world_size = n;
  for (const Member& m : r.members) result.world_size += m.args.local_world_size;
  const JoinArgs& master = r.members.front().args;
  result.master_addr = master.address.empty() ? master.hostname : master.address;
  result.master_port = master.master_port;
  result.restart_count = restarts_used_;
  for (int rank = 0; rank < n; ++rank) {
    result.group_rank = rank;
    join_tickets_[r.members[rank].ticket] = Result<JoinResult>{{}, result};
    result.global_rank_offset += r.members[rank].args.local_world_size;
  }
  changed();
}

void RendezvousState::discard_round(const Status& why) {
  for (const Member& m : forming_.members) join_tickets_[m.ticket] = Result<JoinResult>{why};
  forming_ = {};
  changed();
}

std::optional<Result<JoinResult>> RendezvousState::join_status(JoinTicket ticket, TimePoint now) {
  tick(now);
  auto it = join_tickets_.find(ticket.id);
  if (it == join_tickets_.end()) {
    return Result<JoinResult>{error(Code::kNotFound, "unknown join ticket " + std::to_string(ticket.id))};
  }
  if (!it->second) return std::nullopt;
  auto answer = std::move(it->second);
  join_tickets_.erase(it);
  return answer;
}

void RendezvousState::cancel(JoinTicket ticket) {
  auto it = join_tickets_.find(ticket.id);
  if (it == join_tickets_.end()) return;
  const bool pending = !it->second;
  join_tickets_.erase(it);
  if (!pending) return;
  std::erase_if(forming_.members, [&](const Member& m) { return m.ticket == ticket.id; });
  // Dropping below min_nodes stops the last call; the next min-th join restarts it.
  changed();
}

Result<RendezvousState::Round*> RendezvousState::find_member(std::int64_t round, int group_rank) {
  if (round < 1 || round > current_round()) {
    return {error(Code::kNotFound, "round " + std::to_string(round) + " does not exist (rounds formed so far: " +
                                       std::to_string(current_round()) + ")")};
  }
  Round& r = rounds_[round - 1];
  if (group_rank < 0 || group_rank >= static_cast<int>(r.members.size())) {
    return {error(Code::kInvalidArgument, "group rank " + std::to_string(group_rank) + " is not in round " +
                                              std::to_string(round) + ", which has " +
                                              std::to_string(r.members.size()) + " nodes")};
  }
  return {{}, &r};
}

void RendezvousState::end_round(Round& round, std::string reason) {
  if (round.ended) return;
  round.ended = true;
  round.reason = std::move(reason);
  round.can_restart = restarts_used_ < config_.max_restarts;
  if (round.can_restart) ++restarts_used_;
  changed();
}

Result<HeartbeatReply> RendezvousState::heartbeat(const Auth& auth, std::int64_t round, int group_rank,
                                                  TimePoint now) {
  if (Status s = check_auth(auth); !s.ok()) return {s};
  tick(now);
  auto found = find_member(round, group_rank);
  if (!found.ok()) return {found.status};
  Round& r = *found.value;
  if (r.ended) return {{}, HeartbeatReply{true, r.reason, r.can_restart}};
  r.members[group_rank].last_seen = now;
  return {};
}

Result<FailureReply> RendezvousState::report_failure(const Auth& auth, std::int64_t round, int group_rank,
                                                     const std::string& report, int exit_code, TimePoint now) {
  if (Status s = check_auth(auth); !s.ok()) return {s};
  tick(now);
  auto found = find_member(round, group_rank);
  if (!found.ok()) return {found.status};
  Round& r = *found.value;
  end_round(r, !report.empty() ? report
                               : "node " + std::to_string(group_rank) + " (host " +
                                     quote(host_of(r.members[group_rank].args)) + ") reported a failure, exit code " +
                                     std::to_string(exit_code));
  return {{}, FailureReply{r.can_restart}};
}

Status RendezvousState::leave(const Auth& auth, std::int64_t round, int group_rank, int exit_code, TimePoint now) {
  if (Status s = check_auth(auth); !s.ok()) return s;
  tick(now);
  auto found = find_member(round, group_rank);
  if (!found.ok()) return found.status;
  Round& r = *found.value;
  Member& m = r.members[group_rank];
  if (m.left) return {};
  m.left = true;
  if (exit_code != 0) {
    end_round(r, "node " + std::to_string(group_rank) + " (host " + quote(host_of(m.args)) + ") left with exit code " +
                     std::to_string(exit_code));
  } else if (!r.ended && std::all_of(r.members.begin(), r.members.end(), [](const Member& x) { return x.left; })) {
    r.ended = true;
    r.succeeded = true;
  }
  changed();
  return {};
}

void RendezvousState::expire_heartbeats(TimePoint now) {
  if (rounds_.empty() || rounds_.back().ended) return;
  Round& r = rounds_.back();
  const Member* silent = nullptr;  // the longest silent, lowest rank on ties
  int rank = -1;
  for (int i = 0; i < static_cast<int>(r.members.size()); ++i) {
    const Member& m = r.members[i];
    if (m.left || now < m.last_seen + config_.heartbeat_timeout) continue;
    if (!silent || m.last_seen < silent->last_seen) silent = &m, rank = i;
  }
  if (!silent) return;
  end_round(r, "node " + std::to_string(rank) + " (host " + quote(host_of(silent->args)) +
                   ") stopped sending heartbeats for " + seconds(now - silent->last_seen));
}

// --- Key-value store ---------------------------------------------------------

Status RendezvousState::check_key(const std::string& key) const {
  if (key.empty()) return error(Code::kInvalidArgument, "key is empty");
  if (key.size() > config_.limits.max_key_bytes) {
    return error(Code::kInvalidArgument, "key " + quote(key) + " is " + std::to_string(key.size()) + " bytes, limit " +
                                             std::to_string(config_.limits.max_key_bytes));
  }
  return {};
}

Status RendezvousState::check_value(const std::string& key, const std::string& value) const {
  if (value.size() > config_.limits.max_value_bytes) {
    return error(Code::kInvalidArgument, "value of key " + quote(key) + " is " + std::to_string(value.size()) +
                                             " bytes, limit " + std::to_string(config_.limits.max_value_bytes));
  }
  return {};
}

Status RendezvousState::check_room(const std::string& key) const {
  if (store_.size() >= config_.limits.max_keys && !store_.contains(key)) {
    return error(Code::kResourceExhausted, "cannot add key " + quote(key) + ": the store holds " +
                                               std::to_string(store_.size()) + " keys, limit " +
                                               std::to_string(config_.limits.max_keys));
  }
  return {};
}

Status RendezvousState::set(const Auth& auth, const std::string& key, const std::string& value) {
  for (const Status& s : {check_auth(auth), check_key(key), check_value(key, value), check_room(key)}) {
    if (!s.ok()) return s;
  }
  store_[key] = value;
  changed();
  return {};
}

Result<std::optional<std::string>> RendezvousState::get(const Auth& auth, const std::string& key) {
  for (const Status& s : {check_auth(auth), check_key(key)}) {
    if (!s.ok()) return {s};
  }
  auto it = store_.find(key);
  if (it == store_.end()) return {};
  return {{}, it->second};
}

Result<std::int64_t> RendezvousState::add(const Auth& auth, const std::string& key, std::int64_t delta) {
  for (const Status& s : {check_auth(auth), check_key(key), check_room(key)}) {
    if (!s.ok()) return {s};
  }
  std::int64_t value = 0;
  if (auto it = store_.find(key); it != store_.end()) {
    const std::string& text = it->second;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
      return {error(Code::kInvalidArgument, "cannot add to key " + quote(key) + ": its value " + quote(text) +
                                                " is not a decimal int64")};
    }
  }
  if (__builtin_add_overflow(value, delta, &value)) {
    return {error(Code::kInvalidArgument, "adding " + std::to_string(delta) + " to key " + quote(key) +
                                              " overflows int64 (value " + store_[key] + ")")};
  }
  store_[key] = std::to_string(value);
  changed();
  return {{}, value};
}

Result<CompareSetResult> RendezvousState::compare_set(const Auth& auth, const std::string& key,
                                                      const std::string& expected, const std::string& desired) {
  for (const Status& s : {check_auth(auth), check_key(key), check_value(key, desired)}) {
    if (!s.ok()) return {s};
  }
  auto it = store_.find(key);
  const bool swap = it == store_.end() ? expected.empty() : it->second == expected;
  if (!swap) return {{}, CompareSetResult{false, it == store_.end() ? "" : it->second}};
  if (Status s = check_room(key); !s.ok()) return {s};
  store_[key] = desired;
  changed();
  return {{}, CompareSetResult{true, desired}};
}

Result<bool> RendezvousState::check(const Auth& auth, const std::vector<std::string>& keys) {
  if (Status s = check_auth(auth); !s.ok()) return {s};
  bool all = true;
  for (const std::string& key : keys) {
    if (Status s = check_key(key); !s.ok()) return {s};
    all = all && store_.contains(key);
  }
  return {{}, all};
}

Result<bool> RendezvousState::remove(const Auth& auth, const std::string& key) {
  for (const Status& s : {check_auth(auth), check_key(key)}) {
    if (!s.ok()) return {s};
  }
  if (store_.erase(key) == 0) return {{}, false};
  changed();
  return {{}, true};
}

Result<std::int64_t> RendezvousState::num_keys(const Auth& auth) {
  if (Status s = check_auth(auth); !s.ok()) return {s};
  return {{}, static_cast<std::int64_t>(store_.size())};
}

// --- Barriers ----------------------------------------------------------------

Result<BarrierTicket> RendezvousState::barrier_arrive(const Auth& auth, const std::string& name, int rank,
                                                      int world_size, const std::string& host, TimePoint deadline,
                                                      TimePoint now) {
  if (Status s = check_auth(auth); !s.ok()) return {s};
  tick(now);
  if (name.empty()) return {error(Code::kInvalidArgument, "barrier name is empty")};
  if (name.size() > config_.limits.max_key_bytes) {
    return {error(Code::kInvalidArgument, "barrier name " + quote(name) + " is " + std::to_string(name.size()) +
                                              " bytes, limit " + std::to_string(config_.limits.max_key_bytes))};
  }
  const std::string what = "barrier " + quote(name) + ": ";
  if (world_size < 1 || world_size > config_.limits.max_barrier_world) {
    return {error(Code::kInvalidArgument, what + "world size " + std::to_string(world_size) + " is outside [1, " +
                                              std::to_string(config_.limits.max_barrier_world) + "]")};
  }
  if (rank < 0 || rank >= world_size) {
    return {error(Code::kInvalidArgument, what + "rank " + std::to_string(rank) + " is outside [0, " +
                                              std::to_string(world_size) + ")")};
  }
  auto it = barriers_.find(name);
  if (it == barriers_.end()) {
    if (barriers_.size() >= config_.limits.max_open_barriers) {
      return {error(Code::kResourceExhausted, "cannot open " + what + std::to_string(barriers_.size()) +
                                                  " barriers are open, limit " +
                                                  std::to_string(config_.limits.max_open_barriers))};
    }
    it = barriers_.emplace(name, Barrier{world_size, {}}).first;
  } else if (it->second.world_size != world_size) {
    return {error(Code::kInvalidArgument, what + "rank " + std::to_string(rank) + " gives world size " +
                                              std::to_string(world_size) + ", earlier ranks gave " +
                                              std::to_string(it->second.world_size))};
  } else if (auto first = it->second.arrived.find(rank); first != it->second.arrived.end()) {
    return {error(Code::kInvalidArgument, what + "rank " + std::to_string(rank) + " arrived twice (first from host " +
                                              quote(first->second.host) + ")")};
  }
  Barrier& barrier = it->second;
  const std::uint64_t id = next_id_++;
  barrier.arrived[rank] = Arrival{id, host, now, deadline};
  barrier_tickets_[id] = PendingBarrier{name, rank, std::nullopt};
  barrier_deadlines_.emplace(deadline, id);
  changed();
  if (barrier.arrived.size() == static_cast<std::size_t>(world_size)) {
    for (const auto& [r, arrival] : barrier.arrived) {
      barrier_tickets_[arrival.ticket].answer = Status{};
      barrier_deadlines_.erase({arrival.deadline, arrival.ticket});
    }
    barriers_.erase(it);  // the next arrival under this name starts a new generation
  }
  return {{}, BarrierTicket{id}};
}

void RendezvousState::withdraw(const std::string& name, int rank) {
  auto it = barriers_.find(name);
  if (it == barriers_.end()) return;
  auto arrival = it->second.arrived.find(rank);
  if (arrival == it->second.arrived.end()) return;
  barrier_deadlines_.erase({arrival->second.deadline, arrival->second.ticket});
  it->second.arrived.erase(arrival);
  if (it->second.arrived.empty()) barriers_.erase(it);
  changed();
}

void RendezvousState::expire_barriers(TimePoint now) {
  // Tickets expiring at the same moment share one description of who is
  // missing, so a mass timeout costs one pass over each barrier.
  std::map<std::string, std::vector<std::uint64_t>> expired;
  for (auto it = barrier_deadlines_.begin(); it != barrier_deadlines_.end() && it->first <= now; ++it) {
    expired[barrier_tickets_.at(it->second).name].push_back(it->second);
  }
  for (const auto& [name, tickets] : expired) {
    const Barrier& barrier = barriers_.at(name);
    std::vector<std::pair<int, int>> missing;  // inclusive ranges between arrivals
    std::map<std::string, std::vector<int>> ranks_by_host;
    int prev = -1;
    for (const auto& [rank, arrival] : barrier.arrived) {
      if (rank > prev + 1) missing.emplace_back(prev + 1, rank - 1);
      prev = rank;
      ranks_by_host[arrival.host].push_back(rank);
    }
    if (prev + 1 < barrier.world_size) missing.emplace_back(prev + 1, barrier.world_size - 1);
    const long count = barrier.world_size - static_cast<long>(barrier.arrived.size());
    std::string tail = format_ranks(missing, count) + (count == 1 ? " never arrived" : " never arrived") +
                       " (arrived: ";
    int shown = 0;
    for (const auto& [host, ranks] : ranks_by_host) {
      if (shown++ == 8) {
        tail += ", ... (" + std::to_string(ranks_by_host.size()) + " hosts in all)";
        break;
      }
      tail += (shown > 1 ? ", " : "") + format_ranks(ranks) + " on " + quote(host);
    }
    tail += ")";
    for (std::uint64_t id : tickets) {
      PendingBarrier& pending = barrier_tickets_.at(id);
      const Arrival& arrival = barrier.arrived.at(pending.rank);
      pending.answer = error(Code::kDeadlineExceeded, "barrier " + quote(name) + " timed out after " +
                                                          seconds(arrival.deadline - arrival.arrived) + ": " + tail);
    }
    for (std::uint64_t id : tickets) withdraw(name, barrier_tickets_.at(id).rank);  // may erase `barrier`
  }
}

std::optional<Status> RendezvousState::barrier_status(BarrierTicket ticket, TimePoint now) {
  tick(now);
  auto it = barrier_tickets_.find(ticket.id);
  if (it == barrier_tickets_.end()) {
    return error(Code::kNotFound, "unknown barrier ticket " + std::to_string(ticket.id));
  }
  if (!it->second.answer) return std::nullopt;
  Status answer = std::move(*it->second.answer);
  barrier_tickets_.erase(it);
  return answer;
}

void RendezvousState::cancel(BarrierTicket ticket) {
  auto it = barrier_tickets_.find(ticket.id);
  if (it == barrier_tickets_.end()) return;
  if (!it->second.answer) withdraw(it->second.name, it->second.rank);
  barrier_tickets_.erase(it);
}

// --- Time ----------------------------------------------------------------------

void RendezvousState::tick(TimePoint now) {
  maybe_close_round(now);
  expire_heartbeats(now);
  expire_barriers(now);
}

std::optional<TimePoint> RendezvousState::next_deadline() const {
  std::optional<TimePoint> next;
  auto consider = [&](TimePoint t) {
    if (!next || t < *next) next = t;
  };
  const auto joined = static_cast<int>(forming_.members.size());
  if (joined >= config_.min_nodes) {
    consider(forming_.min_reached + config_.last_call_timeout);
  } else if (joined > 0) {
    consider(forming_.first_join + config_.join_timeout);
  }
  if (!rounds_.empty() && !rounds_.back().ended) {
    for (const Member& m : rounds_.back().members) {
      if (!m.left) consider(m.last_seen + config_.heartbeat_timeout);
    }
  }
  if (!barrier_deadlines_.empty()) consider(barrier_deadlines_.begin()->first);
  return next;
}

}  // namespace ddp::launcher
