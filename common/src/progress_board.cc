#include "ddp/common/progress_board.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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

ProgressSlot* map_slots(int fd, int slots) {
  void* p = mmap(nullptr, sizeof(ProgressSlot) * static_cast<size_t>(slots), PROT_READ | PROT_WRITE,
                 MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : static_cast<ProgressSlot*>(p);
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
  if (ftruncate(fd, static_cast<off_t>(sizeof(ProgressSlot) * static_cast<size_t>(slots))) != 0) {
    int e = errno;
    close(fd);
    throw Error(std::string("progress board: ftruncate: ") + std::strerror(e));
  }
  ProgressSlot* base = map_slots(fd, slots);
  if (base == nullptr) {
    int e = errno;
    close(fd);
    throw Error(std::string("progress board: mmap: ") + std::strerror(e));
  }
  return ProgressBoard(fd, base, slots);  // a fresh memfd reads as zeros: every slot is empty
}

std::optional<ProgressBoard> ProgressBoard::attach(int fd, int slot) {
  if (fd < 0 || slot < 0) return std::nullopt;
  struct stat st {};
  if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  const auto slots = static_cast<int>(static_cast<size_t>(st.st_size) / sizeof(ProgressSlot));
  if (slot >= slots) return std::nullopt;
  ProgressSlot* base = map_slots(static_cast<int>(fd), slots);
  if (base == nullptr) return std::nullopt;
  return ProgressBoard(-1, base, slots);
}

ProgressBoard::ProgressBoard(ProgressBoard&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      base_(std::exchange(other.base_, nullptr)),
      slots_(std::exchange(other.slots_, 0)) {}

ProgressBoard& ProgressBoard::operator=(ProgressBoard&& other) noexcept {
  if (this != &other) {
    this->~ProgressBoard();
    fd_ = std::exchange(other.fd_, -1);
    base_ = std::exchange(other.base_, nullptr);
    slots_ = std::exchange(other.slots_, 0);
  }
  return *this;
}

ProgressBoard::~ProgressBoard() {
  if (base_ != nullptr) munmap(base_, sizeof(ProgressSlot) * static_cast<size_t>(slots_));
  if (fd_ >= 0) close(fd_);
}

}  // namespace ddp
