#include "rendezvous/rendezvous_state.h"

#include "ddp/common/error.h"
#include "rendezvous/messages.h"

namespace ddp::launcher {
namespace {

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
    if ((!refused.is(RpcCode::kUnauthenticated) || config_.token.empty()) &&
        phase() == Phase::kForming) {
      formation_.fail_forming(RpcError(
          refused.code(), cat("host ", quote(host_of(args)), " was refused: ", refused.what())));
    }
    throw;
  }
  if (const std::optional<RpcError>& why = formation_.misconfigured()) throw *why;
  tick(now);
  if (!config_.heal) return formation_.join(args, now, {});
  return formation_.join(args, now,
                         [&](Round& running) { return liveness_.admit(running, args, now); });
}

std::optional<RoundAssignment> RendezvousState::join_status(JoinTicket ticket, TimePoint now) {
  tick(now);
  return formation_.join_status(ticket);
}

RoundStatus RendezvousState::heartbeat(const Auth& auth, std::int64_t round, int group_rank,
                                       TimePoint now, bool heard_end, std::uint64_t member) {
  check_auth(auth);
  tick(now);
  Round& r = formation_.find_member(round, group_rank);
  return liveness_.heartbeat(r, round, group_rank, now, heard_end, member);
}

std::optional<RoundStatus> RendezvousState::round_end(std::int64_t round, int group_rank,
                                                      TimePoint now, std::uint64_t member) {
  tick(now);
  try {
    return liveness_.round_end(formation_.find_member(round, group_rank), round, group_rank,
                               member);
  } catch (const RpcError& gone) {
    return RoundStatus{true, false, false, gone.what()};
  }
}

bool RendezvousState::report_failure(const Auth& auth, std::int64_t round, int group_rank,
                                     const std::string& report, int exit_code, TimePoint now,
                                     std::uint64_t member) {
  check_auth(auth);
  tick(now);
  Round& r = formation_.find_member(round, group_rank);
  return liveness_.report_failure(r, group_rank, report, exit_code, member);
}

void RendezvousState::leave(const Auth& auth, std::int64_t round, int group_rank, int exit_code,
                            TimePoint now, std::uint64_t member) {
  check_auth(auth);
  tick(now);
  liveness_.leave(formation_.find_member(round, group_rank), group_rank, exit_code, member);
}

// --- Key-value store and barriers -------------------------------------------

KeyValueStore& RendezvousState::store(const Auth& auth) {
  check_auth(auth);
  return store_;
}

Barriers& RendezvousState::barriers(const Auth& auth, TimePoint now) {
  check_auth(auth);
  tick(now);
  return barriers_;
}

// --- Time ----------------------------------------------------------------------

void RendezvousState::tick(TimePoint now) {
  formation_.maybe_close_round(now);
  liveness_.expire(now);
  barriers_.expire(now);
}

std::optional<TimePoint> RendezvousState::next_deadline() const {
  std::optional<TimePoint> next;
  for (std::optional<TimePoint> t :
       {formation_.next_deadline(), liveness_.next_deadline(), barriers_.next_deadline()}) {
    if (t && (!next || *t < *next)) next = t;
  }
  return next;
}

std::string RendezvousState::broken_invariant() const {
  if (std::string why = store_.broken_invariant(); !why.empty()) return why;
  if (std::string why = barriers_.broken_invariant(); !why.empty()) return why;
  return formation_.broken_invariant();
}

}  // namespace ddp::launcher
