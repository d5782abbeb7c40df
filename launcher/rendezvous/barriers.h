#pragma once
// The rendezvous's named barriers. A barrier completes (every ticket of it
// passes) when world_size distinct ranks have arrived; the next arrival
// under the same name starts a new generation. A ticket whose deadline
// passes first fails with kDeadlineExceeded naming the ranks missing at that
// moment (and where the others came from), and its rank is withdrawn:
// completion means every rank waited at the same time. Pure logic with the
// time passed in; callers check the caller's token first. Not thread-safe.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "ddp/common/error.h"
#include "rendezvous/limits.h"

namespace ddp::launcher {

struct BarrierTicket {
  std::uint64_t id = 0;
};

class Barriers {
 public:
  explicit Barriers(const RendezvousLimits& limits) : limits_(limits) {}

  // Throws ddp::RpcError, arriving nowhere: kInvalidArgument (empty or
  // oversized name, world size outside [1, max_world_size], rank outside
  // [0, world_size), a world size that differs from earlier arrivals', a
  // rank arriving twice in one generation); kResourceExhausted
  // (max_open_barriers are open).
  BarrierTicket arrive(const std::string& name, int rank, int world_size, const std::string& host,
                       TimePoint deadline, TimePoint now);
  // false while waiting; true once the barrier completed. The final answer
  // consumes the ticket: a timed-out ticket throws RpcError
  // kDeadlineExceeded, an unknown or consumed one kNotFound. Call
  // expire(now) first.
  bool passed(BarrierTicket ticket);
  // The caller went away: a waiting rank is withdrawn.
  void cancel(BarrierTicket ticket);
  // Fails the tickets whose deadline has passed.
  void expire(TimePoint now);
  std::optional<TimePoint> next_deadline() const;

  std::uint64_t changes() const { return changes_; }  // increments on every change
  std::string broken_invariant() const;               // "" when the open barriers are consistent

 private:
  struct Arrival {
    std::uint64_t ticket = 0;
    std::string host;
    TimePoint arrived{};
    TimePoint deadline{};
  };
  struct Barrier {
    int world_size = 0;
    std::map<int, Arrival> arrived;  // by rank
    // Ranks of this generation that arrived but timed out before the others
    // came: not "never arrived" in later ranks' timeout messages.
    std::set<int> gave_up;
  };
  struct Pending {
    std::string name;
    int rank = 0;
    bool final = false;               // completed or timed out
    std::optional<RpcError> failure;  // why it timed out
  };

  void withdraw(const std::string& name, int rank);
  static std::string describe_missing(const Barrier& barrier);

  const RendezvousLimits& limits_;
  std::uint64_t next_ticket_ = 1;
  std::uint64_t changes_ = 0;
  std::map<std::string, Barrier> open_;  // open (incomplete) barriers by name
  std::map<std::uint64_t, Pending> tickets_;
  std::set<std::pair<TimePoint, std::uint64_t>> deadlines_;  // pending tickets only
};

}  // namespace ddp::launcher
