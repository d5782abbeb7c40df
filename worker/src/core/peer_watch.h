#pragma once
// Which peers of a group are gone, as far as this process can see
// (internal), for transports that never notice a dead or departed peer
// themselves (NCCL between GPUs of one machine spins in its kernel): their
// waits ask now and then, and stop as soon as one is gone.
//
// - Exited: the ranks of this rank's node (the group's placement) whose
//   process, found through the "proc/<rank>" key every ProcessGroup member
//   sets, is gone; only those in this process's PID namespace can be asked.
// - Left: ProcessGroup::abort() counts each rank that leaves under
//   "left_count", and the first one names itself under "left_first" (a
//   departed peer on this machine is alive: its pid says nothing).
// Store traffic stays independent of the world's size: one key per peer of
// this node, read once, and one counter.

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "core/process_identity.h"
#include "ddp/store.h"

namespace ddp::detail {

class PeerWatch {
 public:
  // `store`: the group's (null: nothing to watch). This node's ranks are
  // first_local .. first_local + local_size - 1 (the group's placement).
  // Not thread-safe: one thread asks (the group's executor).
  PeerWatch(std::shared_ptr<Store> store, int rank, int first_local, int local_size)
      : store_(std::move(store)), here_(pid_namespace_of(process_identity())) {
    for (int r = first_local; r < first_local + local_size && store_ && !here_.empty(); ++r) {
      if (r != rank) unknown_.insert(r);
    }
  }

  // "rank R (pid P) exited" for the first watched rank whose process is
  // gone, else nullopt. Cheap: a peer's key is read once it is there, and
  // then only /proc is asked.
  std::optional<std::string> first_exited() {
    for (auto it = unknown_.begin(); it != unknown_.end();) {
      try {
        const std::string there =
            store_->get("proc/" + std::to_string(*it), std::chrono::milliseconds(1));
        if (pid_namespace_of(there) == here_)
          pids_[*it] = std::stoi(there.substr(there.rfind(' ') + 1));
        it = unknown_.erase(it);  // known: watched, or in another PID namespace (not)
      } catch (const std::exception&) {
        ++it;  // not set yet: ask again next time
      }
    }
    for (const auto& [r, pid] : pids_) {
      if (proc_says_dead(pid)) {
        return "rank " + std::to_string(r) + " (pid " + std::to_string(pid) + ") exited";
      }
    }
    return std::nullopt;
  }

  // "rank R left the group" once some rank aborted the group (R: the first
  // to), else nullopt. A store round trip or two: ask it only of a wait that
  // is already long.
  std::optional<std::string> first_left() {
    if (!store_) return std::nullopt;
    try {
      if (store_->add("left_count", 0) == 0) return std::nullopt;
      return "rank " + store_->get("left_first", std::chrono::milliseconds(1)) + " left the group";
    } catch (const std::exception&) {
      // The name is not there yet (or the store is unreachable: then the
      // count was not read either, and the wait's own timeout decides).
    }
    return std::nullopt;
  }

 private:
  std::shared_ptr<Store> store_;
  std::string here_;
  std::set<int> unknown_;      // this node's ranks whose key was not read yet
  std::map<int, pid_t> pids_;  // this node's ranks in this PID namespace
};

}  // namespace ddp::detail
