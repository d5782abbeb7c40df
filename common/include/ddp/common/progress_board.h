#pragma once
// The progress board: one slot per local rank, in memory shared between
// ddprun and its workers, in which libddp counts each rank's collectives so
// ddprun can tell a rank that makes progress from one that is stuck, and
// which collective a stuck rank waits in, without asking it (--hang_timeout).
//
// ddprun creates the board (an anonymous memfd: nothing to clean up, gone
// with the last process that maps it) and passes its descriptor to the
// workers as DDP_PROGRESS_FD. Writers (libddp) update only their own slot;
// readers (ddprun) read every slot. Counters are atomics, so a reader sees
// each value whole; a slot's fields may come from slightly different moments.

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

namespace ddp {

// The collectives a slot can name (ProgressSlot::op).
enum class ProgressOp : std::uint32_t {
  kNone = 0,
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kGather,
  kScatter,
  kAllToAll,
  kReduceScatter,
  kBarrier,
};
// "all_reduce" for kAllReduce, ...; "collective" for kNone or an unknown value.
const char* progress_op_name(ProgressOp op);
// The op named `name` ("all_reduce", ...), kNone for any other name.
ProgressOp progress_op_of(const std::string& name);

struct alignas(64) ProgressSlot {
  std::atomic<std::uint64_t> begun{0};      // collectives this rank has begun
  std::atomic<std::uint64_t> completed{0};  // ... that have ended (done or failed)
  std::atomic<std::uint32_t> op{0};         // ProgressOp of the last one begun
  std::atomic<std::uint32_t> attached{0};   // nonzero once libddp writes this slot
  // CLOCK_MONOTONIC nanoseconds at which the last collective began (ddprun
  // status: how long a rank has been inside it), and the total time spent
  // inside collectives (metrics: collective wait).
  std::atomic<std::uint64_t> begun_ns{0};
  std::atomic<std::uint64_t> wait_ns{0};
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

class ProgressBoard {
 public:
  // A new board of `slots` slots, all zero. Throws ddp::Error when the
  // memory cannot be created or mapped. The descriptor is close-on-exec:
  // the spawner makes it inheritable in the child.
  static ProgressBoard create(int slots);
  // The board behind descriptor `fd` (the contract's DDP_PROGRESS_FD), or
  // nullopt when `fd` is negative or names no board with a slot `slot` (then
  // libddp counts nothing; the job runs as without --hang_timeout).
  static std::optional<ProgressBoard> attach(int fd, int slot);

  ProgressBoard(ProgressBoard&& other) noexcept;
  ProgressBoard& operator=(ProgressBoard&& other) noexcept;
  ProgressBoard(const ProgressBoard&) = delete;
  ProgressBoard& operator=(const ProgressBoard&) = delete;
  ~ProgressBoard();

  int fd() const { return fd_; }
  int slots() const { return slots_; }
  ProgressSlot& slot(int i) { return base_[i]; }
  const ProgressSlot& slot(int i) const { return base_[i]; }

 private:
  ProgressBoard(int fd, ProgressSlot* base, int slots) : fd_(fd), base_(base), slots_(slots) {}
  int fd_ = -1;  // -1 for an attached board (the worker's descriptor stays open, unowned)
  ProgressSlot* base_ = nullptr;
  int slots_ = 0;
};

}  // namespace ddp
