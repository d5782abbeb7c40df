// ProcessGroup::missing_ranks(): after a collective failed, which ranks had
// not reached it, and what is known of each, for the failure's message.

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/lost_nodes.h"
#include "core/process_identity.h"
#include "ddp/common/proc_stat.h"
#include "ddp/process_group.h"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

std::optional<std::string> peek(Store& store, const std::string& key) {
  try {
    return store.get(key, std::chrono::milliseconds(1));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::string ProcessGroup::missing_ranks(std::uint64_t sequence) {
  // Each rank whose collective failed says so; ranks that never say so within a
  // short window had not arrived (stuck elsewhere or dead). A rank known to be
  // gone needs no waiting for: it left the group, its process in this
  // process's PID namespace exited, or (under --on_failure=heal, across
  // machines) its node was left out by the rendezvous or its node's ddprun
  // saw its process exit.
  try {
    const std::string key = "diag/" + std::to_string(sequence) + "/";
    store_->set(key + std::to_string(rank_), "1");
    const std::string here_ns = detail::pid_namespace_of(detail::process_identity());
    struct Process {
      long pid;    // as its own PID namespace numbers it
      bool local;  // in this process's PID namespace: its pid can be checked
    };
    std::map<int, Process> procs;  // of the ranks that set their identity
    std::vector<int> undecided;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      undecided.push_back(r);
      const auto there = peek(*store_, "proc/" + std::to_string(r));
      const long pid = there ? detail::pid_in(*there) : -1;
      if (pid > 0) procs[r] = {pid, detail::checkable_pid(*there, here_ns).has_value()};
    }
    // Why rank r is known to be gone, else nullopt.
    const auto gone = [&](int r) -> std::optional<std::string> {
      if (peek(*store_, "left/" + std::to_string(r))) return "left the group";
      const Member& m = members_.members[static_cast<std::size_t>(r)];
      if (lost_nodes_ && lost_nodes_->lost(m.node)) {
        return "its node " + std::to_string(m.node) + " was left out by the rendezvous";
      }
      const auto proc = procs.find(r);
      if (proc == procs.end()) return std::nullopt;
      const auto [pid, local] = proc->second;
      if (local) {
        if (process_exited(static_cast<pid_t>(pid)))
          return "pid " + std::to_string(pid) + ", exited";
      } else if (lost_nodes_ && lost_nodes_->exited(m.id, pid)) {
        return "pid " + std::to_string(pid) + ", exited, as its node's ddprun saw";
      }
      return std::nullopt;
    };
    std::vector<std::string> missing;
    bool found_dead = false;
    Clock::time_point dead_seen;
    const auto deadline = Clock::now() + std::min<std::chrono::milliseconds>(
                                             options_.timeout, std::chrono::seconds(3));
    while (!undecided.empty()) {
      // Once a dead rank explains the failure, ranks that have not said so
      // within 20 ms more are named as they are rather than waited for (one
      // may be stuck in the collective behind this very rank, and free only
      // once it gives up). Ranks the same death failed say so within a few
      // ms; under live recovery every ms here delays the survivors' reform.
      const auto now = Clock::now();
      const bool last_look =
          now >= deadline || (found_dead && now >= dead_seen + std::chrono::milliseconds(20));
      if (lost_nodes_) lost_nodes_->refresh();
      std::erase_if(undecided, [&](int r) {
        if (peek(*store_, key + std::to_string(r))) return true;  // it reached the collective
        if (auto why = gone(r)) {
          missing.push_back(std::to_string(r) + " (" + *why + ")");
          if (!found_dead) dead_seen = Clock::now();
          found_dead = true;
          return true;
        }
        if (!last_look) return false;
        missing.push_back(std::to_string(r) +
                          (found_dead ? " (alive; maybe still inside this collective)" : ""));
        return true;
      });
      if (!undecided.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::sort(missing.begin(), missing.end(), [](const std::string& a, const std::string& b) {
      return std::stoi(a) < std::stoi(b);
    });
    if (missing.empty()) return "; every rank reached this collective";
    std::string list;
    for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
    return "; ranks that had not arrived: " + list;
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace ddp
