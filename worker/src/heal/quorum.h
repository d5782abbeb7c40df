#pragma once
// The rule by which the members of a group agree on the next epoch's member
// set (internal; pure logic, the store protocol is in healer.cc). Each
// process that takes part publishes an Arrival; one closer, once the rule
// says the epoch is ready, publishes the set every member then reads.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ddp/heal.h"
#include "ddp/process_group.h"

namespace ddp::detail {

// What a process publishes when it arrives at an epoch.
struct Arrival {
  int id = 0;                  // launch rank
  int node = 0;                // GROUP_RANK
  std::string proc;            // detail::process_identity(): who can check it is alive
  std::int64_t committed = 0;  // steps it has applied (-1: none, it just started)
  bool operator==(const Arrival&) const = default;
};

// "id node committed proc" (proc last: it contains a space).
std::string encode(const Arrival& arrival);
// Throws ddp::Error naming `what` when `text` is not an encoded arrival.
Arrival decode_arrival(const std::string& text, const std::string& what);
// One arrival per line.
std::string encode(const std::vector<Arrival>& arrivals);
std::vector<Arrival> decode_arrivals(const std::string& text, const std::string& what);

// Whether the process `proc` is known to be gone (a process on this machine
// whose pid is gone or a zombie); false when this process cannot tell.
using DeathOracle = std::function<bool(const std::string& proc)>;
DeathOracle local_death_oracle();

// The closer's rule. The epoch is ready when every member of the previous
// epoch has arrived or is known dead, or once `deadline` has passed (members
// whose liveness cannot be checked are then left out).
bool quorum_ready(const std::vector<Arrival>& previous, const std::map<int, Arrival>& arrived,
                  const DeathOracle& is_dead, std::chrono::steady_clock::time_point now,
                  std::chrono::steady_clock::time_point deadline);

// Whether the closer holds a ready epoch open for a relaunch: `now` is
// before `until` and a member of `previous` whose process is known dead has
// no live arrival under its id yet (a relaunch arrives under its
// predecessor's id). Admitted in this epoch, in its predecessor's place, a
// relaunch that asks within about a step costs one reform; left for a later
// one, it would wait for a step boundary of the shrunk group (a whole step
// of a large model) and the members would form twice.
bool awaits_relaunch(const std::vector<Arrival>& previous, const std::map<int, Arrival>& arrived,
                     const DeathOracle& is_dead, std::chrono::steady_clock::time_point now,
                     std::chrono::steady_clock::time_point until);

// The next epoch's members: every arrival whose process is not known dead,
// in rank order (node, then id).
std::vector<Arrival> quorum_members(const std::map<int, Arrival>& arrived,
                                    const DeathOracle& is_dead);

// Who left, arrived, or was replaced by another process between two epochs.
EpochChange epoch_change(const std::vector<Arrival>& before, const std::vector<Arrival>& after);

// The member set of `members` at `epoch`.
MemberSet member_set(std::uint64_t epoch, const std::vector<Arrival>& members);

// How many step boundaries the members skip before they next ask whether
// processes wait to be admitted (a broadcast: across hosts a network round
// trip, too dear for every short step), given that `boundaries` boundaries
// took `elapsed` since the last asking, which had said to skip `previous`:
// enough to ask about every `interval`, growing at most to 2 x previous + 1
// (after a rebuild, 0: the first boundaries may not be steps yet) and at
// most kMaxSkippedBoundaries (a step that grows later, say an evaluation,
// delays an admission by at most that many steps); at once smaller when
// steps grow.
inline constexpr int kMaxSkippedBoundaries = 64;
int boundaries_to_skip(std::chrono::nanoseconds elapsed, int boundaries,
                       std::chrono::nanoseconds interval, int previous);

}  // namespace ddp::detail
