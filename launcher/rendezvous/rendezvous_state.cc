#include "rendezvous/rendezvous_state.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <tuple>
#include <type_traits>

#include "ddp/common/error.h"

namespace ddp::launcher {
namespace {

// cat("rank ", 3, " of ", name): message text from strings and numbers.
template <class T>
std::string text_of(const T& part) {
  if constexpr (std::is_arithmetic_v<T>) {
    return std::to_string(part);
  } else {
    return std::string(part);
  }
}
template <class... Parts>
std::string cat(const Parts&... parts) {
  return (std::string() + ... + text_of(parts));
}
template <class... Parts>
Status error(Code code, const Parts&... parts) {
  return {code, cat(parts...)};
}

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

// Who a joiner is across its retries.
std::string identity_of(const JoinArgs& args) {
  return cat(args.hostname, '\n', args.address, '\n', args.node_rank);
}

// "rank 3" / "ranks 0-2, 5" from inclusive ranges; long lists are cut, since
// a barrier may span a million ranks.
std::string format_ranks(const std::vector<std::pair<int, int>>& ranges, long count) {
  std::string out = count == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    if (i == 16) return cat(out, ", ... (", count, " in all)");
    out += cat(i > 0 ? ", " : "", ranges[i].first);
    if (ranges[i].second > ranges[i].first) out += cat("-", ranges[i].second);
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

const char* code_name(Code code) {
  switch (code) {
    case Code::kOk:
      return "OK";
    case Code::kUnauthenticated:
      return "UNAUTHENTICATED";
    case Code::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case Code::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case Code::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case Code::kNotFound:
      return "NOT_FOUND";
    case Code::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case Code::kAborted:
      return "ABORTED";
    case Code::kUnavailable:
      return "UNAVAILABLE";
  }
  return "UNKNOWN";
}

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

Status RendezvousState::check_auth(const Auth& auth) const {
  if (config_.token.empty()) {
    if (!auth.token.empty()) {
      return error(Code::kUnauthenticated,
                   "this node has a rendezvous token but the rendezvous runs without one: give "
                   "every node the same DDP_RDZV_TOKEN (or --rdzv_token), or none");
    }
  } else if (!same_secret(auth.token, config_.token)) {
    return error(Code::kUnauthenticated,
                 auth.token.empty() ? "missing rendezvous token: the rendezvous requires one (set "
                                      "DDP_RDZV_TOKEN or --rdzv_token on every node)"
                                    : "wrong rendezvous token");
  }
  if (auth.run_id != config_.run_id) {
    return error(Code::kInvalidArgument, "run id ", quote(auth.run_id),
                 " does not match this server's run ", quote(config_.run_id));
  }
  return {};
}

// --- Membership and rounds --------------------------------------------------

Result<JoinTicket> RendezvousState::join(const Auth& auth, const JoinArgs& args, TimePoint now) {
  if (Status s = check_auth(auth); !s.ok()) {
    // A misconfigured node of this job (another run id, or a token where the
    // server has none) fails the forming round at once: the others would
    // otherwise wait out the join timeout for a node that cannot come. Only
    // for requests the server cannot take for an intruder's: with a token
    // configured, a request without it is refused and changes nothing.
    if (s.code != Code::kUnauthenticated || config_.token.empty()) {
      fail_forming_for(s, host_of(args));
    }
    return {s};
  }
  if (misconfigured_) return {*misconfigured_};
  tick(now);
  const std::string host = cat("host ", quote(host_of(args)));
  if (args.local_world_size < 1) {
    return {error(Code::kInvalidArgument, "local world size ", args.local_world_size, " of ", host,
                  " must be at least 1")};
  }
  if (args.node_rank < -1 || args.node_rank >= config_.max_nodes) {
    return {error(Code::kInvalidArgument, "node rank ", args.node_rank, " of ", host,
                  " is outside [0, ", config_.max_nodes, ") for ", nnodes_flag())};
  }
  if (phase() == Phase::kRunning) {
    if (Status s = admit_during_round(args); !s.ok()) {
      if (s.code == Code::kUnavailable) waiting_for_place_.insert(identity_of(args));
      return {s};
    }
  }
  waiting_for_place_.erase(identity_of(args));  // it hears the answer now
  switch (phase()) {
    case Phase::kSucceeded:
      return {error(Code::kFailedPrecondition, "run ", quote(config_.run_id),
                    " has already completed")};
    case Phase::kFailed:
      return {error(Code::kFailedPrecondition, "run ", quote(config_.run_id),
                    " failed with no restarts left (max ", config_.max_restarts,
                    "): ", rounds_.back().reason)};
    case Phase::kRunning:  // admit_during_round() ended the round or refused
    case Phase::kForming:
      break;
  }
  std::int64_t world_size = args.local_world_size;
  for (const Member& m : forming_.members) {
    if (args.node_rank >= 0 && m.args.node_rank == args.node_rank) {
      // Two nodes of one job claim a rank: a configuration error that no
      // waiting can fix, so every joiner hears of it now.
      Status why = error(Code::kInvalidArgument, "node rank ", args.node_rank,
                         " was given to two nodes: host ", quote(host_of(m.args)), " and ", host,
                         "; give each node its own --node_rank (or none, for assigned ranks)");
      fail_forming(why);
      return {why};
    }
    world_size += m.args.local_world_size;
  }
  if (world_size > config_.limits.max_world_size) {
    return {error(Code::kResourceExhausted, host, " cannot join: the world size would be ",
                  world_size, ", limit ", config_.limits.max_world_size)};
  }
  const std::uint64_t id = next_id_++;
  if (forming_.members.empty()) forming_.first_join = now;
  forming_.members.push_back(Member{args, id, id, now, false});
  if (forming_.members.size() == static_cast<std::size_t>(config_.min_nodes))
    forming_.min_reached = now;
  join_tickets_[id] = std::nullopt;
  changed();
  maybe_close_round(now);  // closes at once when this was the max_nodes-th join
  return {{}, JoinTicket{id}};
}

// A join while a round runs. The node may be one of the round's own,
// relaunched after its agent died (same explicit node rank, or same host and
// address for an assigned rank): the round has lost that agent, so it ends
// as a failure (one restart) and the node joins the next. Else, an elastic
// round with room grows: it ends without using a restart and the next round
// takes the newcomer (torchrun's scale-up). A full round keeps running and the
// node is told to wait (kUnavailable: the agent asks again).
Status RendezvousState::admit_during_round(const JoinArgs& args) {
  Round& running = rounds_.back();
  const int size = static_cast<int>(running.members.size());
  for (int i = 0; i < size; ++i) {
    const JoinArgs& was = running.members[i].args;
    const bool same_rank = args.node_rank >= 0 && was.node_rank == args.node_rank;
    const bool same_host = args.node_rank < 0 && was.node_rank < 0 && was.hostname == args.hostname &&
                           was.address == args.address;
    if (!running.members[i].left && (same_rank || same_host)) {
      end_round(running, cat(describe_node(running, i), " was relaunched (a new agent joined in its place)"),
                true);
      return {};
    }
  }
  if (size < config_.max_nodes) {
    end_round(running,
              cat("scale-up: host ", quote(host_of(args)), " arrived while round ", current_round(),
                  " ran with ", size, " of at most ", config_.max_nodes, " nodes"),
              false);
    return {};
  }
  return error(Code::kUnavailable, "round ", current_round(), " is full (", size, " nodes, ",
               nnodes_flag(), "): host ", quote(host_of(args)),
               " waits for a place in a later round");
}

void RendezvousState::fail_forming_for(const Status& why, const std::string& host) {
  if (phase() != Phase::kForming) return;
  fail_forming({why.code, cat("host ", quote(host), " was refused: ", why.message)});
}

void RendezvousState::fail_forming(const Status& why) {
  // Remembered: a node of the job that joins later hears it too.
  misconfigured_ = why;
  discard_round(why);
}

void RendezvousState::maybe_close_round(TimePoint now) {
  const auto n = static_cast<int>(forming_.members.size());
  if (n == 0) return;
  if (n >= config_.max_nodes ||
      (n >= config_.min_nodes && now >= forming_.min_reached + config_.last_call_timeout)) {
    close_round(now);
  } else if (n < config_.min_nodes && now >= forming_.first_join + config_.join_timeout) {
    discard_round(error(Code::kDeadlineExceeded, join_timeout_message()));
  }
}

// "1 of 2 nodes joined (--nnodes=2; missing node rank 1; joined: 'a')": the
// missing ranks are those of [0, min_nodes) still free once the automatic
// nodes take the lowest free ones.
std::string RendezvousState::join_timeout_message() const {
  std::vector<bool> taken(config_.max_nodes, false);
  int automatic = 0;
  std::string hosts;
  for (const Member& m : forming_.members) {
    if (m.args.node_rank >= 0) {
      taken[m.args.node_rank] = true;
    } else {
      ++automatic;
    }
    hosts += cat(hosts.empty() ? "" : ", ", quote(host_of(m.args)));
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
  return cat("rendezvous join timed out after ", seconds(config_.join_timeout), ": ",
             forming_.members.size(), " of ", config_.min_nodes, " nodes joined (", nnodes_flag(),
             "; missing node ", format_ranks(missing), "; joined: ", hosts, ")");
}

void RendezvousState::close_round(TimePoint now) {
  const std::vector<Member>& joined = forming_.members;
  const auto n = static_cast<int>(joined.size());
  std::vector<int> slot(n, -1);  // group rank -> index in `joined`
  std::vector<int> automatic;
  for (int i = 0; i < n; ++i) {
    const int rank = joined[i].args.node_rank;
    if (rank >= n) {
      return discard_round(error(Code::kAborted, "node rank ", rank, " (host ",
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

  JoinResult result;
  result.round = current_round() + 1;
  result.group_world_size = n;
  for (const Member& m : round.members) result.world_size += m.args.local_world_size;
  const JoinArgs& master = round.members.front().args;
  result.master_addr = master.address.empty() ? master.hostname : master.address;
  result.master_port = master.master_port;
  result.restart_count = restarts_used_;
  result.reason = last_end_reason_;
  for (const Member& m : round.members) {
    join_tickets_[m.ticket] = Result<JoinResult>{{}, result};
    ++result.group_rank;
    result.global_rank_offset += m.args.local_world_size;
  }
  rounds_.push_back(std::move(round));
  forming_ = {};
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
    return Result<JoinResult>{error(Code::kNotFound, "unknown join ticket ", ticket.id)};
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
  // Dropping below min_nodes stops the last call; the next min-th join restarts it.
  std::erase_if(forming_.members, [&](const Member& m) { return m.ticket == ticket.id; });
  changed();
}

Result<RendezvousState::Round*> RendezvousState::find_member(std::int64_t round, int group_rank) {
  if (round < 1 || round > current_round()) {
    return {error(Code::kNotFound, "round ", round,
                  " does not exist (rounds formed so far: ", current_round(), ")")};
  }
  Round& r = rounds_[round - 1];
  if (group_rank < 0 || group_rank >= static_cast<int>(r.members.size())) {
    return {error(Code::kInvalidArgument, "group rank ", group_rank, " is not in round ", round,
                  ", which has ", r.members.size(), " nodes")};
  }
  return {{}, &r};
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

Result<HeartbeatReply> RendezvousState::heartbeat(const Auth& auth, std::int64_t round,
                                                  int group_rank, TimePoint now, bool heard_end) {
  if (Status s = check_auth(auth); !s.ok()) return {s};
  tick(now);
  auto found = find_member(round, group_rank);
  if (!found.ok()) return {found.status};
  Round& r = *found.value;
  if (r.ended) {
    if (heard_end) r.members[group_rank].informed = true;
    return {{}, HeartbeatReply{true, r.reason, r.can_restart}};
  }
  r.members[group_rank].last_seen = now;
  return {};
}

std::optional<HeartbeatReply> RendezvousState::round_end(std::int64_t round, int group_rank, TimePoint now) {
  tick(now);
  auto found = find_member(round, group_rank);
  if (!found.ok()) return HeartbeatReply{true, found.status.message, false};
  Round& r = *found.value;
  if (!r.ended) return std::nullopt;
  return HeartbeatReply{true, r.reason, r.can_restart};
}

bool RendezvousState::outcome_delivered() const {
  if (rounds_.empty() || !rounds_.back().ended) return false;
  if (!waiting_for_place_.empty()) return false;  // they ask again each second
  const auto& members = rounds_.back().members;
  return std::all_of(members.begin(), members.end(), [](const Member& m) { return m.informed; });
}

Result<FailureReply> RendezvousState::report_failure(const Auth& auth, std::int64_t round,
                                                     int group_rank, const std::string& report,
                                                     int exit_code, TimePoint now) {
  if (Status s = check_auth(auth); !s.ok()) return {s};
  tick(now);
  auto found = find_member(round, group_rank);
  if (!found.ok()) return {found.status};
  Round& r = *found.value;
  r.members[group_rank].informed = true;  // the reporter knows
  end_round(r, !report.empty() ? report
                               : cat(describe_node(r, group_rank),
                                     " reported a failure, exit code ", exit_code));
  return {{}, FailureReply{r.can_restart}};
}

Status RendezvousState::leave(const Auth& auth, std::int64_t round, int group_rank, int exit_code,
                              TimePoint now) {
  if (Status s = check_auth(auth); !s.ok()) return s;
  tick(now);
  auto found = find_member(round, group_rank);
  if (!found.ok()) return found.status;
  Round& r = *found.value;
  if (r.members[group_rank].left) return {};
  r.members[group_rank].left = true;
  if (exit_code != 0) {
    r.members[group_rank].informed = true;  // it failed: it knows
    end_round(r, cat(describe_node(r, group_rank), " left with exit code ", exit_code));
  } else if (!r.ended && std::all_of(r.members.begin(), r.members.end(),
                                     [](const Member& m) { return m.left; })) {
    r.ended = r.succeeded = true;
  }
  changed();
  return {};
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
  end_round(r, cat(describe_node(r, silent), " stopped sending heartbeats for ",
                   seconds(now - r.members[silent].last_seen)));
}

// --- Key-value store ---------------------------------------------------------

Status RendezvousState::check_key(const std::string& key) const {
  if (key.empty()) return error(Code::kInvalidArgument, "key is empty");
  if (key.size() > config_.limits.max_key_bytes) {
    return error(Code::kInvalidArgument, "key ", quote(key), " is ", key.size(), " bytes, limit ",
                 config_.limits.max_key_bytes);
  }
  return {};
}

Status RendezvousState::check_value(const std::string& key, const std::string& value) const {
  if (value.size() > config_.limits.max_value_bytes) {
    return error(Code::kInvalidArgument, "value of key ", quote(key), " is ", value.size(),
                 " bytes, limit ", config_.limits.max_value_bytes);
  }
  return {};
}

Status RendezvousState::check_room(const std::string& key, std::size_t value_bytes) const {
  auto it = store_.find(key);
  if (store_.size() >= config_.limits.max_keys && it == store_.end()) {
    return error(Code::kResourceExhausted, "cannot add key ", quote(key), ": the store holds ",
                 store_.size(), " keys, limit ", config_.limits.max_keys, " (--rdzv_conf max_keys)");
  }
  const std::size_t freed = it == store_.end() ? 0 : it->first.size() + it->second.size();
  const std::size_t after = store_bytes_ - freed + key.size() + value_bytes;
  if (after > config_.limits.max_store_bytes && after > store_bytes_) {
    return error(Code::kResourceExhausted, "cannot set key ", quote(key), " (", value_bytes,
                 " bytes): the store would hold ", after, " bytes, limit ", config_.limits.max_store_bytes,
                 " (--rdzv_conf max_store_bytes)");
  }
  return {};
}

void RendezvousState::put(const std::string& key, std::string value) {
  auto [it, added] = store_.try_emplace(key);
  store_bytes_ -= added ? 0 : it->first.size() + it->second.size();
  it->second = std::move(value);
  store_bytes_ += it->first.size() + it->second.size();
}

Status RendezvousState::set(const Auth& auth, const std::string& key, const std::string& value) {
  for (const Status& s :
       {check_auth(auth), check_key(key), check_value(key, value), check_room(key, value.size())}) {
    if (!s.ok()) return s;
  }
  put(key, value);
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

Result<std::int64_t> RendezvousState::add(const Auth& auth, const std::string& key,
                                          std::int64_t delta) {
  for (const Status& s : {check_auth(auth), check_key(key), check_room(key, 20)}) {  // an int64's digits
    if (!s.ok()) return {s};
  }
  std::int64_t value = 0;
  if (auto it = store_.find(key); it != store_.end()) {
    const char *begin = it->second.data(), *end = begin + it->second.size();
    auto [stop, ec] = std::from_chars(begin, end, value);
    if (ec != std::errc() || stop != end || begin == end) {
      return {error(Code::kInvalidArgument, "cannot add to key ", quote(key), ": its value ",
                    quote(it->second), " is not a decimal int64")};
    }
  }
  std::int64_t sum = 0;
  if (__builtin_add_overflow(value, delta, &sum)) {
    return {error(Code::kInvalidArgument, "adding ", delta, " to key ", quote(key), " (value ",
                  value, ") overflows int64")};
  }
  put(key, std::to_string(sum));
  changed();
  return {{}, sum};
}

Result<CompareSetResult> RendezvousState::compare_set(const Auth& auth, const std::string& key,
                                                      const std::string& expected,
                                                      const std::string& desired) {
  for (const Status& s : {check_auth(auth), check_key(key), check_value(key, desired)}) {
    if (!s.ok()) return {s};
  }
  auto it = store_.find(key);
  const bool missing = it == store_.end();
  if (missing ? !expected.empty() : it->second != expected) {
    return {{}, CompareSetResult{false, missing ? "" : it->second}};
  }
  if (Status s = check_room(key, desired.size()); !s.ok()) return {s};
  put(key, desired);
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
  auto it = store_.find(key);
  if (it == store_.end()) return {{}, false};
  store_bytes_ -= it->first.size() + it->second.size();
  store_.erase(it);
  changed();
  return {{}, true};
}

Result<std::int64_t> RendezvousState::num_keys(const Auth& auth) {
  if (Status s = check_auth(auth); !s.ok()) return {s};
  return {{}, static_cast<std::int64_t>(store_.size())};
}

// --- Barriers ----------------------------------------------------------------

Result<BarrierTicket> RendezvousState::barrier_arrive(const Auth& auth, const std::string& name,
                                                      int rank, int world_size,
                                                      const std::string& host, TimePoint deadline,
                                                      TimePoint now) {
  if (Status s = check_auth(auth); !s.ok()) return {s};
  tick(now);
  if (name.empty()) return {error(Code::kInvalidArgument, "barrier name is empty")};
  if (name.size() > config_.limits.max_key_bytes) {
    return {error(Code::kInvalidArgument, "barrier name ", quote(name), " is ", name.size(),
                  " bytes, limit ", config_.limits.max_key_bytes)};
  }
  const std::string what = cat("barrier ", quote(name), ": ");
  if (world_size < 1 || world_size > config_.limits.max_world_size) {
    return {error(Code::kInvalidArgument, what, "world size ", world_size, " is outside [1, ",
                  config_.limits.max_world_size, "]")};
  }
  if (rank < 0 || rank >= world_size) {
    return {
        error(Code::kInvalidArgument, what, "rank ", rank, " is outside [0, ", world_size, ")")};
  }
  auto it = barriers_.find(name);
  if (it == barriers_.end()) {
    if (barriers_.size() >= config_.limits.max_open_barriers) {
      return {error(Code::kResourceExhausted, "cannot open ", what, barriers_.size(),
                    " barriers are open, limit ", config_.limits.max_open_barriers)};
    }
    it = barriers_.emplace(name, Barrier{world_size, {}, {}}).first;
  } else if (it->second.world_size != world_size) {
    return {error(Code::kInvalidArgument, what, "rank ", rank, " gives world size ", world_size,
                  ", earlier ranks gave ", it->second.world_size)};
  } else if (auto first = it->second.arrived.find(rank); first != it->second.arrived.end()) {
    return {error(Code::kInvalidArgument, what, "rank ", rank, " arrived twice (first from host ",
                  quote(first->second.host), ")")};
  }
  Barrier& barrier = it->second;
  const std::uint64_t id = next_id_++;
  barrier.arrived[rank] = Arrival{id, host, now, deadline};
  barrier.gave_up.erase(rank);
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

// "ranks 1, 3 never arrived (arrived: rank 0 on 'a', ranks 2, 4-7 on 'b')".
std::string RendezvousState::describe_missing(const Barrier& barrier) {
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
    text = cat(format_ranks(missing, barrier.world_size - static_cast<long>(seen.size())), " never arrived");
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

void RendezvousState::expire_barriers(TimePoint now) {
  // Tickets of one barrier expiring together share one description of who is
  // missing, so a mass timeout costs one pass over the barrier, not one each.
  std::map<std::string, std::vector<std::uint64_t>> expired;
  for (auto it = barrier_deadlines_.begin(); it != barrier_deadlines_.end() && it->first <= now;
       ++it) {
    expired[barrier_tickets_.at(it->second).name].push_back(it->second);
  }
  for (const auto& [name, tickets] : expired) {
    const Barrier& barrier = barriers_.at(name);
    const std::string missing = describe_missing(barrier);
    for (std::uint64_t id : tickets) {
      PendingBarrier& pending = barrier_tickets_.at(id);
      const Arrival& arrival = barrier.arrived.at(pending.rank);
      pending.answer = error(Code::kDeadlineExceeded, "barrier ", quote(name), " timed out after ",
                             seconds(arrival.deadline - arrival.arrived), ": ", missing);
    }
    for (std::uint64_t id : tickets) {
      const int rank = barrier_tickets_.at(id).rank;
      withdraw(name, rank);  // may erase the barrier (then nobody waits on it)
      if (auto open = barriers_.find(name); open != barriers_.end()) open->second.gave_up.insert(rank);
    }
  }
}

std::optional<Status> RendezvousState::barrier_status(BarrierTicket ticket, TimePoint now) {
  tick(now);
  auto it = barrier_tickets_.find(ticket.id);
  if (it == barrier_tickets_.end())
    return error(Code::kNotFound, "unknown barrier ticket ", ticket.id);
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

std::string RendezvousState::broken_invariant() const {
  std::size_t bytes = 0;
  for (const auto& [key, value] : store_) bytes += key.size() + value.size();
  if (bytes != store_bytes_) return cat("store byte count ", store_bytes_, " but the keys and values hold ", bytes);
  if (store_.size() > config_.limits.max_keys) return cat("store holds ", store_.size(), " keys, over max_keys");
  if (store_bytes_ > config_.limits.max_store_bytes) return cat("store holds ", store_bytes_, " bytes, over the limit");
  if (restarts_used_ > config_.max_restarts) return cat(restarts_used_, " restarts used, over max_restarts");
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
    if (i + 1 < rounds_.size() && !rounds_[i].ended) return cat("round ", i + 1, " never ended but a later one formed");
    if (r.succeeded && !r.ended) return cat("round ", i + 1, " succeeded without ending");
    for (std::size_t g = 0; g < r.members.size(); ++g) {
      const int explicit_rank = r.members[g].args.node_rank;
      if (explicit_rank >= 0 && explicit_rank != static_cast<int>(g)) {
        return cat("round ", i + 1, ": node rank ", explicit_rank, " got group rank ", g);
      }
    }
  }
  for (const auto& [name, barrier] : barriers_) {
    if (static_cast<int>(barrier.arrived.size()) >= barrier.world_size) {
      return cat("barrier ", quote(name), " is complete but still open");
    }
    for (const auto& [rank, arrival] : barrier.arrived) {
      if (rank < 0 || rank >= barrier.world_size) return cat("barrier ", quote(name), " holds rank ", rank);
      if (barrier.gave_up.contains(rank)) return cat("barrier ", quote(name), ": rank ", rank, " both waits and gave up");
    }
  }
  return "";
}

}  // namespace ddp::launcher
