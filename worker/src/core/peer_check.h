#pragma once
// What ProcessGroup::check_peers() looks at (internal): a PeerWatch of the
// group's ranks on this node, and of departures when the group spans
// several nodes, asked from any thread, at most every 10 ms.

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "core/peer_watch.h"
#include "ddp/store.h"

namespace ddp::detail {

class PeerCheck {
 public:
  // `store`: the group's (null: nothing to watch). This node's ranks are
  // first_local .. first_local + local_size - 1 of `size`. `lost`: the
  // group's nodes the rendezvous leaves out (none: not asked). Reads
  // nothing yet: the watch is made at the first look.
  PeerCheck(std::shared_ptr<Store> store, int rank, int first_local, int local_size, int size,
            std::optional<LostNodes> lost = std::nullopt)
      : store_(std::move(store)),
        lost_(std::move(lost)),
        rank_(rank),
        first_local_(first_local),
        local_size_(local_size),
        spans_nodes_(local_size < size) {}

  // Why some member can no longer take part ("rank R (pid P) exited", "rank
  // R left the group", "node N was left out by the rendezvous (...)"), else
  // nullopt: also when another thread is looking, or the last look was less
  // than 10 ms ago. Once an answer was found it is given at every later
  // call, at once (a member gone stays gone from this group). Departures and
  // lost nodes are asked of the store only when the group spans several
  // nodes (on one node a dead member's process says it all), and at most
  // every second: a store round trip on the caller's thread is a pause every
  // rank of a busy machine then waits for in its next collective.
  std::optional<std::string> gone();

 private:
  using Clock = PeerWatch::Clock;
  std::optional<std::string> look();  // with mutex_ held
  std::mutex mutex_;
  std::shared_ptr<Store> store_;
  std::optional<LostNodes> lost_;  // handed to the watch
  int rank_, first_local_, local_size_;
  bool spans_nodes_;
  std::unique_ptr<PeerWatch> watch_;         // made by the first look
  std::optional<Clock::time_point> looked_;  // the last look
  std::optional<Clock::time_point> asked_;   // the last ask of the store
  std::string gone_;                         // the first answer; set once
  std::atomic<bool> known_{false};           // gone_ is set (read without the lock)
};

}  // namespace ddp::detail
