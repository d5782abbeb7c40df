#include "core/phase_sync.h"

#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "core/backend.h"  // PeerExitedError
#include "core/process_identity.h"
#include "ddp/common/error.h"
#include "ddp/ddp.h"

namespace ddp::shm {

void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                std::chrono::nanoseconds timeout) {
  if (timeout.count() <= 0) return;
  timespec ts{static_cast<time_t>(timeout.count() / 1000000000),
              static_cast<long>(timeout.count() % 1000000000)};
  // Not FUTEX_PRIVATE: the word lives in memory shared between processes.
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, expected, &ts, nullptr,
          0);
}

void futex_wake_all(std::atomic<std::uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
          0);
}

WaitPolicy WaitPolicy::for_ranks(int ranks) {
  WaitPolicy policy;
  policy.oversubscribed = ranks > node_cpus();
  if (const char* spin = std::getenv("DDP_SHM_SPIN_US"); spin != nullptr && *spin != '\0') {
    char* end = nullptr;
    long us = std::strtol(spin, &end, 10);
    if (end == spin || *end != '\0' || us < 0) {
      throw Error("environment variable DDP_SHM_SPIN_US='" + std::string(spin) +
                  "' is not a whole number >= 0");
    }
    policy.spin = std::chrono::microseconds(us);
  }
  return policy;
}

PhaseSync::PhaseSync(std::vector<Peer> peers, int me, WaitPolicy policy)
    : peers_(std::move(peers)), pidfds_(peers_.size(), -1), me_(me), policy_(policy) {
  phase_ = peers_[me_].word->phase.load(std::memory_order_relaxed);
  for (std::size_t k = 0; k < peers_.size(); ++k) {
    if (static_cast<int>(k) == me_ || peers_[k].pid == 0 || peers_[k].pid == getpid()) continue;
    // A pidfd turns readable when the process exits, zombie or not, and
    // cannot be fooled by pid reuse. Opened while every peer is attached (alive).
    pidfds_[k] = static_cast<int>(syscall(SYS_pidfd_open, peers_[k].pid, 0));
  }
}

PhaseSync::~PhaseSync() {
  for (int fd : pidfds_) {
    if (fd >= 0) close(fd);
  }
}

std::uint32_t PhaseSync::arrive() {
  PhaseWord& mine = *peers_[me_].word;
  ++phase_;
  // seq_cst store then seq_cst load, against the sleeper's seq_cst increment
  // then load: either it sees the new phase or this sees it asleep.
  mine.phase.store(phase_, std::memory_order_seq_cst);
  if (mine.sleepers.load(std::memory_order_seq_cst) != 0) futex_wake_all(mine.phase);
  return phase_;
}

bool PhaseSync::reached(int k, std::uint32_t target) const {
  std::uint32_t seen = peers_[k].word->phase.load(std::memory_order_acquire);
  return static_cast<std::int32_t>(seen - target) >= 0;  // wrap-safe
}

void PhaseSync::wait_all(std::uint32_t target, std::chrono::steady_clock::time_point deadline) {
  for (int k = 0; k < size(); ++k) {
    if (k != me_ && !reached(k, target)) wait_for(k, target, deadline);
  }
}

void PhaseSync::leave() {
  PhaseWord& mine = *peers_[me_].word;
  mine.left.store(1, std::memory_order_seq_cst);
  futex_wake_all(mine.phase);
}

bool PhaseSync::peer_dead(int k) {
  if (peers_[k].word->left.load(std::memory_order_acquire) != 0) return true;
  if (peers_[k].pid == 0 || peers_[k].pid == getpid()) return false;
  if (pidfds_[k] >= 0) {
    pollfd p{pidfds_[k], POLLIN, 0};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
  }
  return process_exited(peers_[k].pid);
}

void PhaseSync::wait_for(int k, std::uint32_t target,
                         std::chrono::steady_clock::time_point deadline) {
  using Clock = std::chrono::steady_clock;
  if (!policy_.oversubscribed) {
    auto until = Clock::now() + policy_.spin;
    for (int i = 1;; ++i) {
      if (reached(k, target)) return;
      cpu_relax();
      if ((i & 255) == 0 && Clock::now() >= until) break;
    }
  } else {
    for (int i = 0; i < policy_.yields; ++i) {
      sched_yield();
      if (reached(k, target)) return;
    }
  }
  PhaseWord& word = *peers_[k].word;
  for (;;) {
    word.sleepers.fetch_add(1, std::memory_order_seq_cst);
    std::uint32_t seen = word.phase.load(std::memory_order_seq_cst);
    auto now = Clock::now();
    if (static_cast<std::int32_t>(seen - target) < 0 && now < deadline) {
      futex_wait(word.phase, seen, std::min<Clock::duration>(policy_.sleep_slice, deadline - now));
    }
    word.sleepers.fetch_sub(1, std::memory_order_relaxed);
    if (reached(k, target)) return;
    if (peers_[me_].word->left.load(std::memory_order_acquire) != 0) {
      throw PeerExitedError("this rank left the group by aborting it");
    }
    if (peers_[k].word->left.load(std::memory_order_acquire) != 0) {
      throw PeerExitedError("rank " + std::to_string(peers_[k].global_rank) +
                            " (same node) left the group (it is rebuilding it after a failure)");
    }
    if (peer_dead(k)) {
      throw PeerExitedError("rank " + std::to_string(peers_[k].global_rank) + " (pid " +
                            std::to_string(peers_[k].pid) +
                            ", same node) exited before reaching this collective's phase " +
                            std::to_string(target));
    }
    if (Clock::now() >= deadline) {
      std::string missing;
      for (int j = 0; j < size(); ++j) {
        if (j != me_ && !reached(j, target))
          missing += (missing.empty() ? "" : ", ") + std::to_string(peers_[j].global_rank);
      }
      throw Error("timed out waiting in shared memory for rank(s) " + missing +
                  " (same node), which had not arrived");
    }
  }
}

}  // namespace ddp::shm
