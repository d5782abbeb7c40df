#pragma once
// Which ranks of a group have exited, as far as this process can see
// (internal): those in its PID namespace, found through the "proc/<rank>"
// keys every ProcessGroup member sets; and whether a rank left the group
// (ProcessGroup::abort counts itself under "left_count" and sets
// "left/<rank>"). For transports that never notice a dead or departed peer
// themselves (NCCL between GPUs of one machine spins in its kernel): their
// waits ask now and then, and stop as soon as one is gone.

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
  // `store`: the group's (null: nothing to watch). Not thread-safe: one
  // thread asks (the group's executor).
  PeerWatch(std::shared_ptr<Store> store, int rank, int size)
      : store_(std::move(store)),
        rank_(rank),
        size_(size),
        here_(pid_namespace_of(process_identity())) {
    for (int r = 0; r < size_ && store_ && !here_.empty(); ++r) {
      if (r != rank_) unknown_.insert(r);
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
        it = unknown_.erase(it);  // known: on this machine, or elsewhere (not watched)
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

  // "rank R left the group" once some rank aborted it, else nullopt. One
  // store round trip: ask it only of a wait that is already long.
  std::optional<std::string> first_left() {
    try {
      if (!store_ || store_->add("left_count", 0) == 0) return std::nullopt;
    } catch (const std::exception&) {
      return std::nullopt;  // the store is unreachable: the wait's own timeout decides
    }
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      try {
        store_->get("left/" + std::to_string(r), std::chrono::milliseconds(1));
        return "rank " + std::to_string(r) + " left the group";
      } catch (const std::exception&) {
      }
    }
    return std::nullopt;  // only this rank left
  }

 private:
  std::shared_ptr<Store> store_;
  int rank_, size_;
  std::string here_;
  std::set<int> unknown_;      // ranks whose key was not read yet
  std::map<int, pid_t> pids_;  // ranks on this machine
};

}  // namespace ddp::detail
