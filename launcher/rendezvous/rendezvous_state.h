#pragma once
// RendezvousState: the logic of the rendezvous server (rounds, members, the
// key-value store, barriers) with no gRPC, no threads and no clock of its own.
// It is NOT thread-safe: RendezvousService wraps one instance in a mutex and a
// condition variable. It is the entry the service uses, and the owner of the
// parts that hold the state: RoundFormation (joins and rounds,
// round_formation.h), NodeLiveness (heartbeats, failures, leaving, lost nodes,
// node_liveness.h), KeyValueStore and Barriers (handed out by store() and
// barriers() once the caller's credentials pass).
//
// Time. Every operation that can depend on time takes `now`, first applies the
// time-based transitions up to `now` (what tick() does), then acts; so tests
// drive time by hand. The store does not depend on time: store() takes no
// `now`.
//
// Refusals. An operation that refuses a request throws ddp::RpcError
// (ddp/common/error.h) with the gRPC code the service answers with (listed
// below as kInvalidArgument, ...) and a message naming the node, rank, key,
// barrier, run or limit at fault. A refusal changes nothing unless said below.
//
// Blocking RPCs are tickets. join() and Barriers::arrive() return a ticket; the
// service polls it (join_status(), Barriers::passed()) whenever version() has
// changed or next_deadline() has passed. The poll that gives the final
// answer, or throws the final refusal, consumes the ticket (polling it again
// is kNotFound). When the client goes away first, the service cancel()s the
// ticket.
//
// Authentication. Every public operation that is an RPC takes the caller's
// Auth first. A wrong token is kUnauthenticated (checked first, so a caller
// without the token learns nothing about the run), a wrong run id
// kInvalidArgument; either way the call changes nothing, not even time-based
// transitions (but see "Authentication" below for a join).
//
// Rounds. Nodes join a *forming* round. It closes when max_nodes have joined,
// or when at least min_nodes have and last_call_timeout has passed since the
// min_nodes-th join. Closing assigns group ranks: explicit node ranks are
// kept; automatic ones fill the free ranks in (hostname, address, arrival)
// order, so the same machines get the same ranks in every round. The forming
// round is discarded, and each of its joiners gets an error, when
//   - it has not closed within join_timeout of its first join: fewer than
//     min_nodes joined (kDeadlineExceeded naming the missing node ranks), or
//     its last call would end after that (kDeadlineExceeded saying so, as
//     torch 2.x's c10d handler gives up at the join deadline), or
//   - it closes with fewer than max_nodes and some explicit node rank is not
//     below the number of nodes that joined (kAborted naming that node).
// A discarded round uses no restart and its number is reused: round numbers
// (1, 2, ...) count the rounds that formed; the next join starts afresh.
//
// A formed round runs until a node reports a failure, leaves with a non-zero
// exit code, or stops heartbeating (the first of these is the round's reason),
// or until every node has left with exit code 0 (the job succeeded). With
// config.heal a silent node is instead *lost*: left out of the running round,
// which goes on while at least min_nodes remain (else it ends as above); a
// lost node that speaks again is told its round ended for it, for good, and
// its reports change nothing. A failed
// round uses one restart, job-wide, however many nodes report it, while
// max_restarts allows; the agents then join again to form the next round,
// whose restart_count is the number of restarts used. Otherwise the job has
// failed and every later join is refused with the round's reason.
//
// Joining while a round runs under config.heal: a node takes the place of a
// lost one with the same local world size (its own old place when it is that
// node relaunched: the same explicit node rank, or for an assigned rank the
// same hostname and address; else the place its explicit node rank names, or
// the lowest lost place) and is admitted at once into the running round with
// the lost node's group rank and ranks (RoundAssignment::joined_running). A
// relaunch of a node that still counts as live is taken for proof that its
// agent is gone: that node is lost at once and the newcomer takes its place.
// Each admission spends one of max_restarts from the store's counter of
// single relaunches (kHealRelaunchesKey, which the agents spend too); with
// none left the join is refused (kFailedPrecondition) and the round goes on.
// Without a place to take, a node that is not one of the round's own joins
// the running round as one more node (the next group rank and the ranks
// after the last; no restart spent, as for a scale-up) when the round has
// fewer than max_nodes, its explicit node rank (if any) is that next group
// rank, the world stays within max_world_size, and the round's program has
// said that it heals in process (the store holds healing_round_key(round));
// the other nodes keep their assignments (their world size is the one the
// round formed with). Otherwise, as follows.
//
// Joining while a round runs (torchrun's elastic membership):
//   - a node of the round relaunched by its scheduler (the same explicit node
//     rank, or for an assigned rank the same hostname and address) ends the
//     round as a failure, using one restart; the newcomer waits in the next;
//   - else, when the round has fewer than max_nodes, it ends without using a
//     restart (scale-up) and the next round takes the newcomer;
//   - else the round is full: kUnavailable, and the node asks again later.
// Every round's RoundAssignment says why the round before it ended.
//
// Authentication. With an empty token the server is unauthenticated; a
// request that carries a token is then refused (the nodes disagree). A join
// refused for its run id, or for a token where the server has none, also
// discards the forming round: the cause is known, so no node waits out its
// join timeout; every later join is refused with the same reason. A join
// without the configured token changes nothing.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "ddp/common/error.h"
#include "ddp/common/rendezvous_types.h"
#include "rendezvous/barriers.h"
#include "rendezvous/key_value_store.h"
#include "rendezvous/limits.h"
#include "rendezvous/node_liveness.h"
#include "rendezvous/rendezvous_config.h"
#include "rendezvous/round_formation.h"

namespace ddp::launcher {

class RendezvousState {
 public:
  using Phase = RendezvousPhase;

  // Throws ddp::Error naming the field when the config is inconsistent
  // (empty run id or token, min_nodes < 1, max_nodes < min_nodes, a timeout
  // that is not positive (the last call may be 0) or over a year, ...).
  explicit RendezvousState(RendezvousConfig config);

  // --- Membership and rounds ---------------------------------------------

  // Refusals: kInvalidArgument (local_world_size < 1, node rank outside
  // [0, max_nodes), node rank already taken in the forming round);
  // kResourceExhausted (the round's world size would pass max_world_size);
  // kResourceExhausted / kFailedPrecondition while a round runs (see above);
  // kFailedPrecondition once the job has succeeded or failed for good.
  JoinTicket join(const Auth& auth, const NodeInfo& args, TimePoint now);
  // nullopt while the round forms; else the node's place in the formed round.
  // Throws kDeadlineExceeded / kAborted (or the refusal that failed it) when
  // the forming round was discarded; kNotFound for an unknown, consumed or
  // cancelled ticket.
  std::optional<RoundAssignment> join_status(JoinTicket ticket, TimePoint now);
  // The joiner went away: a pending node leaves the forming round.
  void cancel(JoinTicket ticket) { formation_.cancel(ticket); }

  // Records that the node is alive. A node of the running round that is
  // silent for heartbeat_timeout (since its last heartbeat, or since the round
  // formed) ends the round. For an ended round, says why it ended.
  // Refusals: kNotFound (no such formed round), kInvalidArgument (group rank).
  // `heard_end`: the node acknowledges that it has heard the round's end
  // (see outcome_delivered); an answer alone does not count, since a node
  // tearing down its monitor may never read it.
  //
  // `member` (here and in round_end, report_failure and leave): the caller's
  // RoundAssignment::member (ids grow with every join). A node whose place
  // another node has taken (heal; a smaller id than the holder's) hears that
  // its round ended for it, and its reports change nothing. 0, or a larger
  // id (the holder, joined to a later round since), is the place's holder.
  RoundStatus heartbeat(const Auth& auth, std::int64_t round, int group_rank, TimePoint now,
                        bool heard_end = false, std::uint64_t member = 0);
  // For a heartbeat the service holds until the round ends: the end once it
  // has come, nullopt while the round runs. Records no liveness: only a
  // heartbeat's arrival does.
  std::optional<RoundStatus> round_end(std::int64_t round, int group_rank, TimePoint now,
                                       std::uint64_t member = 0);
  // Whether the last formed round has ended and every node of it has heard
  // so (acknowledged with a heartbeat, or reported the failure itself) or is
  // gone (ended the round by its silence), and every node told to wait for
  // a place in a full round has asked again since: a hosting node may then stop
  // serving without leaving anyone to learn the outcome from a dead server.
  bool outcome_delivered() const { return formation_.outcome_delivered(); }
  // Ends the round with `report` as its reason unless it has already ended
  // (the first failure wins). An empty report gets a generic reason. Returns
  // whether a new round will be formed (the round's can_restart).
  bool report_failure(const Auth& auth, std::int64_t round, int group_rank,
                      const std::string& report, int exit_code, TimePoint now,
                      std::uint64_t member = 0);
  // The node is done. Exit code 0 from every node completes the job; a
  // non-zero code ends the round like report_failure. Leaving twice is a no-op.
  void leave(const Auth& auth, std::int64_t round, int group_rank, int exit_code, TimePoint now,
             std::uint64_t member = 0);

  // --- Key-value store and barriers ----------------------------------------
  // Each accessor first checks the caller's credentials (check_auth: throws
  // its refusal, changing nothing), then hands out the part itself.

  // The key-value store (one map: the state belongs to one run), with torch's
  // TCPStore semantics and the limits of RendezvousLimits (key_value_store.h).
  // get() gives nullopt for a missing key: waiting is the service's job
  // (re-poll).
  KeyValueStore& store(const Auth& auth);
  // The named barriers (barriers.h), with time applied up to `now` (tick())
  // so that passed() sees tickets past their deadline failed. A ticket is
  // polled with the credentials it arrived with.
  Barriers& barriers(const Auth& auth, TimePoint now);
  // A barrier's waiter went away: its rank is withdrawn. Neither checks
  // credentials (the ticket came from an accepted arrival) nor applies time.
  void cancel(BarrierTicket ticket) { barriers_.cancel(ticket); }

  // --- Time and change tracking ------------------------------------------

  // Applies what time changes: closes a round whose last call passed, discards
  // one whose join timeout passed, ends a round with a silent node, fails
  // barrier tickets past their deadline.
  void tick(TimePoint now);
  // The earliest time at which tick() could change something; nullopt when
  // nothing time-based is pending (the service then sleeps until notified).
  std::optional<TimePoint> next_deadline() const;
  // Increments on every change a waiter may care about (store mutations,
  // joins, rounds closing or ending, barrier progress). Heartbeats that only
  // record liveness do not count: they only move deadlines later.
  std::uint64_t version() const {
    return formation_.changes() + liveness_.changes() + store_.changes() + barriers_.changes();
  }

  // What must hold between any two calls (for tests and the fuzzer): "" when
  // it does, else the first broken rule. Costs a pass over the whole state.
  std::string broken_invariant() const;

  // Called with a round's number when it forms, before any node can learn
  // its place in it (from the call that formed it, under the caller's lock).
  void on_round_formed(std::function<void(std::int64_t round)> observer) {
    formation_.on_round_formed(std::move(observer));
  }
  // Called with one line naming the node when one is lost, or when a node
  // joins the running round (config.heal), from the call that did it, under
  // the caller's lock.
  void on_node_lost(std::function<void(const std::string& what)> observer) {
    liveness_.on_node_lost(std::move(observer));
  }

  // Throws the refusal for a request with a wrong token (kUnauthenticated) or
  // of another run (kInvalidArgument); the read-only Status call uses it.
  void check_auth(const Auth& auth) const;

  Phase phase() const { return formation_.phase(); }
  std::int64_t current_round() const { return formation_.current_round(); }
  int restarts_used() const { return formation_.restarts_used(); }
  const RendezvousConfig& config() const { return config_; }

 private:
  // The parts refer to config_ and to each other: declared in this order.
  RendezvousConfig config_;
  KeyValueStore store_{config_.limits};
  Barriers barriers_{config_.limits};
  RoundFormation formation_{config_};
  NodeLiveness liveness_{config_, formation_, store_};
};

}  // namespace ddp::launcher
