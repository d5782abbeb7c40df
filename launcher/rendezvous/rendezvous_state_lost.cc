// RendezvousState under --on_failure=heal: a node whose heartbeats stop is
// lost, left out of its running round, which goes on while at least
// min_nodes remain (the workers of the others heal without its ranks).

#include <algorithm>

#include "rendezvous/messages.h"
#include "rendezvous/rendezvous_state.h"

namespace ddp::launcher {

void RendezvousState::lose_silent_nodes(Round& r, TimePoint now) {
  const std::int64_t number = static_cast<std::int64_t>(rounds_.size());
  std::string last;
  for (int i = 0; i < static_cast<int>(r.members.size()); ++i) {
    Member& m = r.members[i];
    if (m.left || now < m.last_seen + config_.heartbeat_timeout) continue;
    m.lost = m.left = m.informed = true;  // gone: nobody to tell
    last = cat(describe_node(r, i), " stopped sending heartbeats for ", seconds(now - m.last_seen));
    const auto going_on = std::count_if(r.members.begin(), r.members.end(),
                                        [](const Member& other) { return !other.lost; });
    if (lost_observer_) {
      lost_observer_(cat(last, ": left out of round ", number, " (--on_failure=heal); ", going_on,
                         " node(s) go on"));
    }
  }
  changed();
  const auto live =
      std::count_if(r.members.begin(), r.members.end(), [](const Member& m) { return !m.lost; });
  if (live < config_.min_nodes) {
    end_round(r, cat(last, "; ", live, " node(s) remain, fewer than the ", config_.min_nodes,
                     " the job needs (", nnodes_flag(), ")"));
  } else if (std::all_of(r.members.begin(), r.members.end(),
                         [](const Member& m) { return m.left; })) {
    r.ended = r.succeeded = true;  // the others had finished
  }
}

RoundStatus RendezvousState::lost_status(const Round& r, int group_rank) const {
  const auto number =
      std::find_if(rounds_.begin(), rounds_.end(), [&](const Round& x) { return &x == &r; }) -
      rounds_.begin() + 1;
  return RoundStatus{true, false, false,
                     cat(describe_node(r, group_rank), " was left out of round ", number,
                         " after its heartbeats stopped; the other nodes went on without it "
                         "(--on_failure=heal)")};
}

}  // namespace ddp::launcher
