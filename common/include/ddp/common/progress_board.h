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

#include <array>
#include <atomic>
#include <cstddef>
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

// Steps: after the progress slots, a second array with one slot per local
// rank, in which libddp times the rank's training steps (each synchronising
// finish() of a GradSync or SharedGradSum ends one). Apart from ProgressSlot,
// so that slots stay where a ddprun or libddp of another version expects
// them: a board made by an older ddprun has no step slots (libddp then times
// nothing), and an older libddp leaves them zero.
struct alignas(64) StepSlot {
  std::atomic<std::uint64_t> steps{0};  // steps finished
  // Nanoseconds from one step's end to the next's: the last step's, and the
  // median and 99th percentile (nearest rank) of the last `window` steps.
  std::atomic<std::uint64_t> last_ns{0};
  std::atomic<std::uint64_t> median_ns{0};
  std::atomic<std::uint64_t> p99_ns{0};
  std::atomic<std::uint64_t> window{0};
};
static_assert(sizeof(StepSlot) == 64);

// The durations of a rank's last kCapacity steps, and their median and 99th
// percentile (nearest rank: the smallest duration at least 99% of the window
// does not exceed). Not thread-safe.
class StepWindow {
 public:
  static constexpr std::size_t kCapacity = 128;
  void add(std::uint64_t ns);
  std::size_t size() const { return count_; }
  // 0 for an empty window.
  std::uint64_t percentile(double q) const;

 private:
  std::array<std::uint64_t, kCapacity> ring_{};
  std::size_t next_ = 0;
  std::size_t count_ = 0;
};
// Times one rank's steps into its slot (libddp): each step is counted and
// its duration kept in the window; the median and p99 in the slot are
// recomputed at most every `publish_every_ns` (sorting the window at every
// step would cost a short step of the reference trainer over 1%), and at
// once while the window is filling. Not thread-safe.
class StepTimer {
 public:
  explicit StepTimer(std::uint64_t publish_every_ns = 10'000'000) : every_(publish_every_ns) {}
  // A step ended at `now_ns` (CLOCK_MONOTONIC); the first one has no duration.
  void step_ended(StepSlot& slot, std::uint64_t now_ns);

 private:
  StepWindow window_;
  std::uint64_t every_;
  std::uint64_t previous_end_ = 0;
  std::uint64_t published_ = 0;
};

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
  // A new board of `slots` progress slots and as many step slots, all zero.
  // Throws ddp::Error when the memory cannot be created or mapped. The
  // descriptor is close-on-exec: the spawner makes it inheritable in the child.
  static ProgressBoard create(int slots);
  // The board behind descriptor `fd` (the contract's DDP_PROGRESS_FD), or
  // nullopt when `fd` is negative or names no board with a slot `slot` (then
  // libddp counts nothing; the job runs as without --hang_timeout).
  // `local_world_size`: the board's slots as the worker's contract says
  // (LOCAL_WORLD_SIZE), which tells where the step slots begin; a board
  // without them (an older ddprun) has step_slot() null.
  static std::optional<ProgressBoard> attach(int fd, int slot, int local_world_size);

  ProgressBoard(ProgressBoard&& other) noexcept;
  ProgressBoard& operator=(ProgressBoard&& other) noexcept;
  ProgressBoard(const ProgressBoard&) = delete;
  ProgressBoard& operator=(const ProgressBoard&) = delete;
  ~ProgressBoard();

  int fd() const { return fd_; }
  int slots() const { return slots_; }
  ProgressSlot& slot(int i) { return base_[i]; }
  const ProgressSlot& slot(int i) const { return base_[i]; }
  // Slot `i`'s steps; null when the board has no step slots.
  StepSlot* step_slot(int i) { return steps_ == nullptr ? nullptr : &steps_[i]; }
  const StepSlot* step_slot(int i) const { return steps_ == nullptr ? nullptr : &steps_[i]; }

 private:
  ProgressBoard(int fd, void* base, std::size_t bytes, int slots, bool with_steps);
  int fd_ = -1;  // -1 for an attached board (the worker's descriptor stays open, unowned)
  ProgressSlot* base_ = nullptr;
  StepSlot* steps_ = nullptr;
  std::size_t bytes_ = 0;  // mapped
  int slots_ = 0;
};

}  // namespace ddp
