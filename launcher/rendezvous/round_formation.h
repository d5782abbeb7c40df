#pragma once
// RoundFormation: the rounds of the job (see "Rounds" and "Joining while a
// round runs" in rendezvous_state.h): joins and their tickets, the forming
// round, closing and discarding it, the formed rounds and how each ended,
// the restarts used, and so the job's phase. What nodes report about
// themselves once a round runs (heartbeats, failures, leaving, lost nodes)
// is NodeLiveness's; it ends rounds through end_round(). Callers check
// credentials and apply time first (RendezvousState). Pure logic, not
// thread-safe.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "ddp/common/error.h"
#include "rendezvous/forming_round.h"
#include "rendezvous/round.h"

namespace ddp::launcher {

class RoundFormation {
 public:
  // Under config.heal, the lost-node policy's admission of a joiner into the
  // running round: its ticket, or nullopt when it has no place there (then
  // the usual rules apply). It may throw the joiner's refusal.
  using HealAdmission = std::function<std::optional<JoinTicket>(Round& running)>;

  // `config` must outlive this object.
  explicit RoundFormation(const RendezvousConfig& config) : config_(config), forming_(config) {}

  // Called with a round's number when it forms, before any node can learn
  // its place in it.
  void on_round_formed(std::function<void(std::int64_t round)> observer) {
    round_observer_ = std::move(observer);
  }
  RendezvousPhase phase() const;
  std::int64_t current_round() const { return static_cast<std::int64_t>(rounds_.size()); }
  int restarts_used() const { return restarts_used_; }
  std::uint64_t changes() const { return changes_; }  // increments on every change

  // Set once the job's nodes were found to disagree: every later join is
  // refused with it.
  const std::optional<RpcError>& misconfigured() const { return misconfigured_; }
  // Remembers `why` as misconfigured() and discards the forming round with it.
  void fail_forming(const RpcError& why);

  // A join of an authenticated caller, time applied. `heal` is empty unless
  // config.heal. Refusals as RendezvousState::join.
  JoinTicket join(const NodeInfo& args, TimePoint now, const HealAdmission& heal);
  // As RendezvousState::join_status, time applied.
  std::optional<RoundAssignment> join_status(JoinTicket ticket);
  // The joiner went away: a pending node leaves the forming round.
  void cancel(JoinTicket ticket);
  // Closes the forming round whose last call has ended, or discards the one
  // whose join timeout has passed.
  void maybe_close_round(TimePoint now);
  std::optional<TimePoint> next_deadline() const { return forming_.next_deadline(); }

  // The round `group_rank` belongs to; throws kNotFound / kInvalidArgument.
  Round& find_member(std::int64_t round, int group_rank);
  // The last round while it runs, else null.
  Round* running();
  const Round* running() const;
  // A fresh member id (also the join ticket): ids grow with every join.
  std::uint64_t next_id() { return next_id_++; }
  // Records the answer for the node just admitted at `group_rank` of the
  // running round (its join ticket is its member id) and returns it.
  RoundAssignment answer_joined_running(const Round& round, int group_rank);
  // Ends `round` with `reason` unless it has ended; uses_restart=false for a
  // scale-up, which torchrun does not count either.
  void end_round(Round& round, std::string reason, bool uses_restart = true);

  // As RendezvousState::outcome_delivered.
  bool outcome_delivered() const;
  // The rounds' part of RendezvousState::broken_invariant.
  std::string broken_invariant() const;

 private:
  // A join ticket's answer: pending (monostate), the node's place, or why not.
  using JoinAnswer = std::variant<std::monostate, RoundAssignment, RpcError>;

  // Throws kUnavailable for a full round, or for a rank a live node of
  // another host holds. Returns the ticket of a node admitted into the
  // running round (heal), nullopt when the round ended for it.
  std::optional<JoinTicket> admit_during_round(const NodeInfo& args, TimePoint now,
                                               const HealAdmission& heal);
  void close_round(TimePoint now);
  void discard_round(const RpcError& why);

  const RendezvousConfig& config_;
  std::uint64_t changes_ = 0;
  std::uint64_t next_id_ = 1;  // join tickets and arrivals
  int restarts_used_ = 0;
  std::string last_end_reason_;  // of the last ended round, for the next RoundAssignment
  // Joiners told that the round is full (by identity) that have not asked again since.
  std::set<std::string> waiting_for_place_;
  std::optional<RpcError> misconfigured_;

  FormingRound forming_;
  std::vector<Round> rounds_;  // round N is rounds_[N - 1]
  std::map<std::uint64_t, JoinAnswer> join_tickets_;
  std::function<void(std::int64_t)> round_observer_;
};

}  // namespace ddp::launcher
