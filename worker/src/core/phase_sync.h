#pragma once
// Phase synchronisation of the ranks that share one segment (internal to
// libddp: the shm backend's collectives and GradSync's node-shared sum both
// run in phases). Each rank owns a phase counter: a futex word on its own cache
// line, written only by that rank. A rank "arrives" by raising its counter;
// waiting for a phase means waiting until every peer's counter reached it, so
// no counter is ever reset and a fast rank can run ahead into the next phase.
//
// Waiting spins briefly (ranks <= cores: a peer is running and arrives within
// microseconds), yields at once when ranks outnumber cores (spinning there
// was measured at milliseconds per operation: the peer needs this core), and
// then sleeps on the futex in short slices, between which it checks the
// deadline and whether the awaited peer's process has died. Not thread-safe:
// one PhaseSync per rank, used by that rank's collective thread.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp::shm {

inline constexpr std::size_t kCacheLine = 64;

// One spin-wait pause: tells the core this thread is waiting on memory.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// One rank's counter and the count of peers asleep on it, on separate lines
// (the counter is written by its rank, `sleepers` by the others).
// `left`: set once by its rank when it abandons the group (ProcessGroup::abort),
// so peers stop waiting for it as they would for a dead rank.
struct alignas(kCacheLine) PhaseWord {
  std::atomic<std::uint32_t> phase{0};
  char pad0[kCacheLine - sizeof(std::atomic<std::uint32_t>)];
  std::atomic<std::uint32_t> sleepers{0};
  std::atomic<std::uint32_t> left{0};
  char pad1[kCacheLine - 2 * sizeof(std::atomic<std::uint32_t>)];
};
static_assert(sizeof(PhaseWord) == 2 * kCacheLine);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

struct WaitPolicy {
  bool oversubscribed = false;           // more ranks than cores: yield instead of spinning
  std::chrono::nanoseconds spin{20000};  // how long to spin before sleeping
  int yields = 64;                       // sched_yield rounds before sleeping (oversubscribed)
  std::chrono::milliseconds sleep_slice{
      10};  // futex wait slice: how often death and deadline are checked

  // The policy for `ranks` ranks on this process's CPUs (DDP_SHM_SPIN_US sets the spin).
  static WaitPolicy for_ranks(int ranks);
};

// A peer as the waiter sees it: its word in the segment and its process.
struct Peer {
  PhaseWord* word = nullptr;
  pid_t pid = 0;        // 0: same process (ranks as threads), never checked for death
  int global_rank = 0;  // for error messages
};

class PhaseSync {
 public:
  PhaseSync(std::vector<Peer> peers, int me, WaitPolicy policy);
  ~PhaseSync();
  PhaseSync(const PhaseSync&) = delete;
  PhaseSync& operator=(const PhaseSync&) = delete;

  // Raises this rank's counter to the next phase and wakes peers asleep on it.
  // Returns the phase reached.
  std::uint32_t arrive();
  // Waits until every peer reached this rank's phase. Throws PeerExitedError
  // naming a peer that died or, at `deadline`, ddp::Error naming every peer
  // that had not arrived.
  void wait_all(std::chrono::steady_clock::time_point deadline) { wait_all(phase_, deadline); }
  // Waits until every peer reached `target`, a phase this rank already
  // arrived at (returned by arrive()): lets a rank arrive ahead and wait for
  // an earlier phase later. Throws as wait_all().
  void wait_all(std::uint32_t target, std::chrono::steady_clock::time_point deadline);
  // arrive() then wait_all().
  void phase(std::chrono::steady_clock::time_point deadline) {
    arrive();
    wait_all(deadline);
  }
  int size() const { return static_cast<int>(peers_.size()); }
  // This rank leaves: every peer waiting on it, and this rank's own waits,
  // fail with PeerExitedError within a wait slice. Any thread; never blocks.
  void leave();

 private:
  bool reached(int k, std::uint32_t target) const;
  void wait_for(int k, std::uint32_t target, std::chrono::steady_clock::time_point deadline);
  bool peer_dead(int k);

  std::vector<Peer> peers_;
  std::vector<int> pidfds_;  // -1 where unavailable (then /proc is asked)
  int me_;
  WaitPolicy policy_;
  std::uint32_t phase_ = 0;
};

// Blocks until `word` satisfies `done` (checked on every change), sleeping on
// the futex in slices of `slice`; returns false at `deadline`.
template <class Done>
bool futex_wait_until(std::atomic<std::uint32_t>& word, Done&& done,
                      std::chrono::steady_clock::time_point deadline,
                      std::chrono::milliseconds slice = std::chrono::milliseconds(10));
void futex_wake_all(std::atomic<std::uint32_t>& word);
// One futex wait: returns when woken, when *word != expected, or after `timeout`.
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                std::chrono::nanoseconds timeout);

template <class Done>
bool futex_wait_until(std::atomic<std::uint32_t>& word, Done&& done,
                      std::chrono::steady_clock::time_point deadline,
                      std::chrono::milliseconds slice) {
  for (;;) {
    std::uint32_t seen = word.load(std::memory_order_acquire);
    if (done(seen)) return true;
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    futex_wait(word, seen, std::min<std::chrono::nanoseconds>(slice, deadline - now));
  }
}

}  // namespace ddp::shm
