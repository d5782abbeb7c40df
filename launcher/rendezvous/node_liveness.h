#pragma once
// NodeLiveness: what the nodes of a formed round say about themselves
// (heartbeats, failure reports, leaving) and what their silence means (see
// "A formed round runs until..." in rendezvous_state.h). A node silent for
// heartbeat_timeout ends the running round; under config.heal
// (--on_failure=heal) it is *lost* instead: left out of the round, which goes
// on while at least min_nodes remain, and a joiner may take a lost node's
// place or grow the round (admit()). A lost or replaced node hears that its
// round ended for it; its reports change nothing.
//
// It acts on the rounds RoundFormation owns, ending them through it, and
// writes the lost nodes and heal relaunches to the store for the workers.
// Callers check credentials and apply time first (RendezvousState). Pure
// logic, not thread-safe.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "rendezvous/key_value_store.h"
#include "rendezvous/round.h"
#include "rendezvous/round_formation.h"

namespace ddp::launcher {

class NodeLiveness {
 public:
  // Each must outlive this object.
  NodeLiveness(const RendezvousConfig& config, RoundFormation& rounds, KeyValueStore& store)
      : config_(config), rounds_(rounds), store_(store) {}
  // It points into its owner's parts: a copy would act on the original's.
  NodeLiveness(const NodeLiveness&) = delete;
  NodeLiveness& operator=(const NodeLiveness&) = delete;

  // As RendezvousState::on_node_lost.
  void on_node_lost(std::function<void(const std::string& what)> observer) {
    lost_observer_ = std::move(observer);
  }

  // `r` is round `number` (RoundFormation::find_member), `member` the
  // caller's member id (0: the place's holder); as RendezvousState's.
  RoundStatus heartbeat(Round& r, std::int64_t number, int group_rank, TimePoint now,
                        bool heard_end, std::uint64_t member);
  std::optional<RoundStatus> round_end(const Round& r, std::int64_t number, int group_rank,
                                       std::uint64_t member) const;
  bool report_failure(Round& r, int group_rank, const std::string& report, int exit_code,
                      std::uint64_t member);
  void leave(Round& r, int group_rank, int exit_code, std::uint64_t member);

  // Ends the running round with a silent node, or loses its silent nodes (heal).
  void expire(TimePoint now);
  // When the running round's first live node would fall silent.
  std::optional<TimePoint> next_deadline() const;
  // Under heal, a joiner that takes a lost place of the running round, or
  // joins it as one more node: its ticket (answered at once), or nullopt.
  // Throws kFailedPrecondition when the relaunches of max_restarts are spent.
  std::optional<JoinTicket> admit(Round& running, const NodeInfo& args, TimePoint now);

  std::uint64_t changes() const { return changes_; }  // increments on every change

 private:
  // Whether the caller is not (any longer) the holder of its place.
  static bool replaced(const Round& r, int group_rank, std::uint64_t member);
  void lose_silent_nodes(Round& r, TimePoint now);
  void lose(Round& r, int group_rank, const std::string& why);
  // What a lost or replaced node hears about its round.
  RoundStatus lost_status(const Round& r, std::int64_t number, int group_rank) const;
  // The lost place a joiner takes under heal.
  std::optional<int> place_to_take(const Round& r, const NodeInfo& args) const;
  JoinTicket take_place(Round& r, int group_rank, const NodeInfo& args, TimePoint now);
  std::optional<JoinTicket> grow_running_round(Round& r, const NodeInfo& args, TimePoint now);

  const RendezvousConfig& config_;
  RoundFormation& rounds_;
  KeyValueStore& store_;
  std::uint64_t changes_ = 0;
  std::function<void(const std::string&)> lost_observer_;
  // When the first live member of round `earliest_round_` falls silent,
  // kept exact: a heartbeat of the member due first, a member added or a
  // loss forgets it (earliest_round_ = -1). expire() and next_deadline()
  // look at every member only then, not at every request (at 16,384 nodes
  // those scans were the server's main cost).
  mutable std::optional<TimePoint> earliest_silent_;
  mutable std::int64_t earliest_round_ = -1;
  // The earliest time a live member of `r` falls silent, remembered.
  std::optional<TimePoint> scan_earliest_silent(const Round& r) const;
};

}  // namespace ddp::launcher
