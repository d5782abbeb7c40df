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
  // Straggler detection: the sum of the CLOCK_MONOTONIC nanoseconds at which
  // this rank began each of its collectives (wrapping; only differences
  // between ranks over the same collectives mean anything), and a sequence
  // word that makes begun, begun_ns and arrival_sum one consistent read (odd
  // while libddp updates them). Both stay 0 with a libddp older than them.
  std::atomic<std::uint64_t> arrival_sum{0};
  std::atomic<std::uint64_t> arrival_version{0};
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
// One cache line, as before the arrival fields: a libddp and a ddprun of
// different versions still agree where each rank's slot is.
static_assert(sizeof(ProgressSlot) == 64);

// A consistent view of one rank's arrivals: it began `seq` collectives, the
// last at `last_ns`, and the sum of all their beginning times is `sum`.
struct ArrivalMark {
  std::uint64_t seq = 0;
  std::uint64_t sum = 0;
  std::uint64_t last_ns = 0;
};
// Records the beginning of a collective at `now_ns` in `slot` (libddp).
void record_arrival(ProgressSlot& slot, std::uint64_t now_ns);
// The slot's arrivals, read consistently; nullopt when the slot has none
// (not attached, no collective yet, an older libddp) or libddp kept
// updating it while read (read again at the next sample).
std::optional<ArrivalMark> read_arrivals(const ProgressSlot& slot);

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
