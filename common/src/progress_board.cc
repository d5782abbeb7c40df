#include "ddp/common/progress_board.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "ddp/common/error.h"

namespace ddp {
namespace {

constexpr const char* kOpNames[] = {"collective",     "all_reduce", "broadcast", "reduce",
                                    "all_gather",     "gather",     "scatter",   "all_to_all",
                                    "reduce_scatter", "barrier"};
constexpr std::uint32_t kOpCount = sizeof kOpNames / sizeof kOpNames[0];

void* map_bytes(int fd, std::size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// A board of `slots` with step slots: both arrays.
std::size_t board_bytes(int slots) {
  return (sizeof(ProgressSlot) + sizeof(StepSlot)) * static_cast<std::size_t>(slots);
}

}  // namespace

const char* progress_op_name(ProgressOp op) {
  auto i = static_cast<std::uint32_t>(op);
  return i < kOpCount ? kOpNames[i] : kOpNames[0];
}

ProgressOp progress_op_of(const std::string& name) {
  for (std::uint32_t i = 1; i < kOpCount; ++i) {
    if (name == kOpNames[i]) return static_cast<ProgressOp>(i);
  }
  return ProgressOp::kNone;
}

void record_arrival(ProgressSlot& slot, std::uint64_t now_ns) {
  // A sequence lock: odd while the fields change. Collectives of one rank
  // may begin on several threads; the version's read-modify-writes keep a
  // reader from taking a half-written pair as whole in that case too.
  slot.arrival_version.fetch_add(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  slot.begun_ns.store(now_ns, std::memory_order_relaxed);
  slot.arrival_sum.store(slot.arrival_sum.load(std::memory_order_relaxed) + now_ns,
                         std::memory_order_relaxed);
  slot.begun.fetch_add(1, std::memory_order_release);
  slot.arrival_version.fetch_add(1, std::memory_order_release);
}

void StepWindow::add(std::uint64_t ns) {
  ring_[next_] = ns;
  next_ = (next_ + 1) % kCapacity;
  count_ = std::min(count_ + 1, kCapacity);
}

std::uint64_t StepWindow::percentile(double q) const {
  if (count_ == 0) return 0;
  std::array<std::uint64_t, kCapacity> sorted = ring_;
  const auto end = sorted.begin() + static_cast<std::ptrdiff_t>(count_);
  // Nearest rank: the ceil(q * n)-th smallest, 1-based.
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(count_)));
  const auto nth = sorted.begin() + static_cast<std::ptrdiff_t>(std::max<std::size_t>(rank, 1) - 1);
  std::nth_element(sorted.begin(), nth, end);
  return *nth;
}

void StepTimer::step_ended(StepSlot& slot, std::uint64_t now_ns) {
  if (previous_end_ != 0 && now_ns > previous_end_) {
    const std::uint64_t took = now_ns - previous_end_;
    window_.add(took);
    slot.last_ns.store(took, std::memory_order_relaxed);
    if (window_.size() < StepWindow::kCapacity || now_ns - published_ >= every_) {
      slot.median_ns.store(window_.percentile(0.5), std::memory_order_relaxed);
      slot.p99_ns.store(window_.percentile(0.99), std::memory_order_relaxed);
      slot.window.store(window_.size(), std::memory_order_relaxed);
      published_ = now_ns;
    }
  }
  previous_end_ = now_ns;
  slot.steps.fetch_add(1, std::memory_order_release);
}

std::optional<ArrivalMark> read_arrivals(const ProgressSlot& slot) {
  for (int attempt = 0; attempt < 4; ++attempt) {
    const std::uint64_t v1 = slot.arrival_version.load(std::memory_order_acquire);
    if (v1 % 2 == 1) continue;
    ArrivalMark m;
    m.seq = slot.begun.load(std::memory_order_relaxed);
    m.sum = slot.arrival_sum.load(std::memory_order_relaxed);
    m.last_ns = slot.begun_ns.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (slot.arrival_version.load(std::memory_order_relaxed) != v1) continue;
    if (v1 == 0 || m.seq == 0) return std::nullopt;  // nothing recorded
    return m;
  }
  return std::nullopt;
}

ProgressBoard ProgressBoard::create(int slots) {
  if (slots <= 0) throw Error("progress board: " + std::to_string(slots) + " slots");
  int fd = memfd_create("ddprun-progress", MFD_CLOEXEC);
  if (fd < 0) throw Error(std::string("progress board: memfd_create: ") + std::strerror(errno));
  if (ftruncate(fd, static_cast<off_t>(board_bytes(slots))) != 0) {
    int e = errno;
    close(fd);
    throw Error(std::string("progress board: ftruncate: ") + std::strerror(e));
  }
  void* base = map_bytes(fd, board_bytes(slots));
  if (base == nullptr) {
    int e = errno;
    close(fd);
    throw Error(std::string("progress board: mmap: ") + std::strerror(e));
  }
  // A fresh memfd reads as zeros: every slot is empty.
  return ProgressBoard(fd, base, board_bytes(slots), slots, true);
}

std::optional<ProgressBoard> ProgressBoard::attach(int fd, int slot, int local_world_size) {
  if (fd < 0 || slot < 0) return std::nullopt;
  struct stat st {};
  if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  const auto size = static_cast<std::size_t>(st.st_size);
  // A board of an older ddprun holds progress slots only.
  const bool with_steps = local_world_size > 0 && size >= board_bytes(local_world_size);
  const int slots = with_steps ? local_world_size : static_cast<int>(size / sizeof(ProgressSlot));
  if (slot >= slots) return std::nullopt;
  const std::size_t bytes =
      with_steps ? board_bytes(slots) : sizeof(ProgressSlot) * static_cast<std::size_t>(slots);
  void* base = map_bytes(static_cast<int>(fd), bytes);
  if (base == nullptr) return std::nullopt;
  return ProgressBoard(-1, base, bytes, slots, with_steps);
}

ProgressBoard::ProgressBoard(int fd, void* base, std::size_t bytes, int slots, bool with_steps)
    : fd_(fd),
      base_(static_cast<ProgressSlot*>(base)),
      steps_(with_steps ? reinterpret_cast<StepSlot*>(base_ + slots) : nullptr),
      bytes_(bytes),
      slots_(slots) {}

ProgressBoard::ProgressBoard(ProgressBoard&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      base_(std::exchange(other.base_, nullptr)),
      steps_(std::exchange(other.steps_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      slots_(std::exchange(other.slots_, 0)) {}

ProgressBoard& ProgressBoard::operator=(ProgressBoard&& other) noexcept {
  if (this != &other) {
    this->~ProgressBoard();
    fd_ = std::exchange(other.fd_, -1);
    base_ = std::exchange(other.base_, nullptr);
    steps_ = std::exchange(other.steps_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    slots_ = std::exchange(other.slots_, 0);
  }
  return *this;
}

ProgressBoard::~ProgressBoard() {
  if (base_ != nullptr) munmap(base_, bytes_);
  if (fd_ >= 0) close(fd_);
}

}  // namespace ddp
