#pragma once
// Which peers of a group are gone, as far as this process can see
// (internal), for transports that do not always notice a dead or departed
// peer themselves (NCCL between GPUs of one machine spins in its kernel;
// Gloo leaves a transfer under way waiting): their waits ask now and then,
// and stop as soon as one is gone; and for ProcessGroup::check_peers().
//
// - Exited: the ranks of this rank's node (the group's placement) whose
//   process, found through the "proc/<rank>" key every ProcessGroup member
//   sets, is gone; only those in this process's PID namespace can be asked.
// - Left: ProcessGroup::abort() counts each rank that leaves under
//   "left_count", and the first one names itself under "left_first" (a
//   departed peer on this machine is alive: its pid says nothing); or the
//   rendezvous left out one of the group's nodes (LostNodes: a machine that
//   died with its link closes no connection).
// Store traffic stays independent of the world's size: one key per peer of
// this node, read once (missing ones asked again every 200 ms), and one
// counter (two with LostNodes).

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "core/lost_nodes.h"
#include "core/process_identity.h"
#include "ddp/store.h"

namespace ddp::detail {

class PeerWatch {
 public:
  // `store`: the group's (null: nothing to watch). This node's ranks are
  // first_local .. first_local + local_size - 1 (the group's placement).
  // `departures`: the store where ProcessGroup::abort() counts departures,
  // when it is not `store` (a backend's inner group, with a prefixed store
  // of its own, watches the enclosing ProcessGroup's); null: `store`.
  // Not thread-safe: one thread asks (the group's executor, or a watcher).
  // `lost`: the group's nodes the rendezvous leaves out (none: not asked).
  // `now`: the clock the 200 ms spacings are measured on (tests inject one).
  using Clock = std::chrono::steady_clock;
  PeerWatch(std::shared_ptr<Store> store, int rank, int first_local, int local_size,
            std::shared_ptr<Store> departures = nullptr,
            std::optional<LostNodes> lost = std::nullopt,
            std::function<Clock::time_point()> now = Clock::now)
      : store_(std::move(store)),
        departures_(departures ? std::move(departures) : store_),
        lost_(std::move(lost)),
        here_(pid_namespace_of(process_identity())),
        now_(std::move(now)) {
    for (int r = first_local; r < first_local + local_size && store_ && !here_.empty(); ++r) {
      if (r != rank) unknown_.insert(r);
    }
  }

  // "rank R (pid P) exited" for the first watched rank whose process is
  // gone, else nullopt. Cheap: a peer's key is read once it is there, and
  // then only its pidfd is polled (ProcessWatch).
  std::optional<std::string> first_exited() {
    learn_pids();
    for (const auto& [r, process] : processes_) {
      if (process.gone()) return exited(r, process.pid());
    }
    return std::nullopt;
  }

  // Why rank `r` can no longer take part in the group's collectives: its
  // process exited (this node's ranks), or some rank left the group (then no
  // collective of the group can complete; the store is asked at most every
  // 200 ms). nullopt while neither is known.
  std::optional<std::string> gone(int r) {
    learn_pids();
    if (auto it = processes_.find(r); it != processes_.end() && it->second.gone())
      return exited(r, it->second.pid());
    return departed();
  }

  // "rank R left the group" once some rank aborted the group (R: the first
  // to), or "node N was left out by the rendezvous (...)", else nullopt; the
  // store is asked at most every 200 ms (set_departure_spacing() changes it).
  std::optional<std::string> departed() {
    const auto now = now_();
    if (!left_ && (!left_asked_ || now - *left_asked_ >= departures_spacing_)) {
      left_asked_ = now;
      left_ = first_left();
    }
    return left_;
  }

  // How often departed() may ask the store: a watcher that asks only of
  // waits already long can afford to ask more often than every 200 ms.
  void set_departure_spacing(std::chrono::milliseconds spacing) { departures_spacing_ = spacing; }

  // departed()'s answer, asked now. A store round trip or a few: ask it only
  // of a wait that is already long.
  std::optional<std::string> first_left() {
    if (lost_) {
      if (auto node = lost_->first_lost()) return node;
    }
    if (!departures_) return std::nullopt;
    try {
      if (departures_->add("left_count", 0) == 0) return std::nullopt;
      return "rank " + departures_->get("left_first", std::chrono::milliseconds(1)) +
             " left the group";
    } catch (const std::exception&) {
      // The name is not there yet (or the store is unreachable: then the
      // count was not read either, and the wait's own timeout decides).
    }
    return std::nullopt;
  }

 private:
  static std::string exited(int r, pid_t pid) {
    return "rank " + std::to_string(r) + " (pid " + std::to_string(pid) + ") exited";
  }

  // Reads the proc keys not read yet (a peer sets its own when it joins),
  // at most every 200 ms while some are missing.
  void learn_pids() {
    if (unknown_.empty()) return;
    const auto now = now_();
    if (learned_ && now - *learned_ < std::chrono::milliseconds(200)) return;
    learned_ = now;
    for (auto it = unknown_.begin(); it != unknown_.end();) {
      try {
        const std::string there =
            store_->get("proc/" + std::to_string(*it), std::chrono::milliseconds(1));
        if (auto pid = checkable_pid(there, here_)) processes_.try_emplace(*it, *pid);
        it = unknown_.erase(it);  // known: watched, or in another PID namespace (not)
      } catch (const std::exception&) {
        ++it;  // not set yet: ask again next time
      }
    }
  }

  std::shared_ptr<Store> store_;
  std::shared_ptr<Store> departures_;  // where "left_count" is: store_ unless told otherwise
  std::optional<LostNodes> lost_;
  std::string here_;
  std::set<int> unknown_;                  // this node's ranks whose key was not read yet
  std::map<int, ProcessWatch> processes_;  // this node's ranks in this PID namespace
  std::function<Clock::time_point()> now_;
  std::optional<Clock::time_point> learned_;     // learn_pids(): the last ask
  std::optional<Clock::time_point> left_asked_;  // gone(): the last ask of the store
  std::chrono::milliseconds departures_spacing_{200};
  std::optional<std::string> left_;  // gone(): who left, once someone did
};

}  // namespace ddp::detail
