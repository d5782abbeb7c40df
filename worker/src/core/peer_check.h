#pragma once
// What ProcessGroup::check_peers() looks at (internal): a PeerWatch of the
// group's ranks on this node and of departures, asked from any thread, at
// most every 10 ms.

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
  // first_local .. first_local + local_size - 1. Reads nothing yet: the
  // watch is made at the first look.
  PeerCheck(std::shared_ptr<Store> store, int rank, int first_local, int local_size)
      : store_(std::move(store)), rank_(rank), first_local_(first_local), local_size_(local_size) {}

  // Why some member can no longer take part ("rank R (pid P) exited", "rank
  // R left the group"), else nullopt: also when another thread is looking,
  // or the last look was less than 10 ms ago.
  std::optional<std::string> gone();

 private:
  std::mutex mutex_;
  std::shared_ptr<Store> store_;
  int rank_, first_local_, local_size_;
  std::unique_ptr<PeerWatch> watch_;                    // made by the first look
  std::optional<PeerWatch::Clock::time_point> looked_;  // the last look
};

}  // namespace ddp::detail
