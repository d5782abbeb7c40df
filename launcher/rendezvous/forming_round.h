#pragma once
// FormingRound: the round that nodes are joining (see "Rounds" in
// rendezvous_state.h): who has joined, in arrival order, and the two
// deadlines that end it. It closes when max_nodes have joined, or when at
// least min_nodes have and the last call (last_call_timeout from the
// min_nodes-th join) has ended within the join timeout; it is discarded
// when join_timeout passes from its first join before that. Closing assigns
// group ranks: explicit node ranks are kept, automatic ones fill the free
// ranks in (hostname, address, arrival) order. It answers no joiner itself:
// RoundFormation owns the tickets. Pure logic, not thread-safe.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/common/error.h"
#include "rendezvous/round.h"

namespace ddp::launcher {

class FormingRound {
 public:
  // `config` must outlive this object.
  explicit FormingRound(const RendezvousConfig& config) : config_(config) {}

  const std::vector<Member>& members() const { return members_; }
  // The refusal (kInvalidArgument) when `args` claims a node rank another
  // joiner holds: the job is misconfigured and no waiting fixes it, so the
  // caller fails the whole round. nullopt otherwise.
  std::optional<RpcError> rank_conflict(const NodeInfo& args) const;
  // Adds the joiner as member `id` (its arrival and ticket). Throws
  // kResourceExhausted, changing nothing, when the round's world size would
  // pass max_world_size.
  void add(const NodeInfo& args, std::uint64_t id, TimePoint now);
  // Drops the joiner holding `ticket`; whether it was here. Dropping below
  // min_nodes stops the last call; the next min_nodes-th join restarts it.
  bool remove(std::uint64_t ticket);

  enum class Due { kNothing, kClose, kDiscard };
  // What time does to the round at `now` (kDiscard: its join timeout passed).
  Due due(TimePoint now) const;
  // Why a round that is due kDiscard failed (kDeadlineExceeded): the node
  // ranks missing, or the last call that would have ended too late.
  RpcError timeout_refusal() const;
  // The refusal (kAborted) when an explicit node rank does not fit the
  // number of nodes that joined, which fails the round as it closes.
  std::optional<RpcError> misfit() const;
  // Closes the round (no misfit()): the members in group rank order, each
  // counted as heard from at `now`. The forming round is empty after.
  std::vector<Member> close(TimePoint now);
  // Empties the forming round, returning its members (in arrival order).
  std::vector<Member> take();

  // The last call's end and the join deadline, whichever comes first.
  std::optional<TimePoint> next_deadline() const;
  std::string broken_invariant() const;  // "" when size and node ranks hold

 private:
  std::string hosts() const;  // the joined hosts, quoted: "'a', 'b'"

  const RendezvousConfig& config_;
  std::vector<Member> members_;  // in arrival order
  TimePoint first_join_{};
  TimePoint min_reached_{};  // when the min_nodes-th node joined
};

}  // namespace ddp::launcher
