#include "backends/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/process_identity.h"
#include "ddp/common/error.h"

namespace ddp::shm {
namespace {

constexpr std::uint64_t kMagic = 0x64647073686d3033ull;  // "ddpshm03"
constexpr std::size_t kPage = 4096;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

std::size_t env_size(const char* name, std::size_t fallback, std::size_t unit, std::size_t lowest) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  unsigned long long value = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0' || value * unit < lowest) {
    throw Error("environment variable " + std::string(name) + "='" + text +
                "' is not a whole number >= " + std::to_string(lowest / unit));
  }
  return static_cast<std::size_t>(value) * unit;
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

Geometry Geometry::from_env(int local_size, std::size_t chunk_bytes) {
  constexpr std::size_t kLowestChunk = 64 << 10;
  Geometry g;
  g.local_size = local_size;
  if (chunk_bytes > 0 && chunk_bytes < kLowestChunk) {
    throw Error("ProcessGroupOptions::shm_chunk_bytes=" + std::to_string(chunk_bytes) +
                " is under the smallest chunk, " + std::to_string(kLowestChunk) + " bytes");
  }
  g.chunk_bytes =
      round_up(chunk_bytes > 0 ? chunk_bytes
                               : env_size("DDP_SHM_CHUNK_KB", g.chunk_bytes, 1024, kLowestChunk),
               kPage);
  g.arena_bytes = round_up(env_size("DDP_SHM_ARENA_MB", g.arena_bytes, 1 << 20, 0), kPage);
  return g;
}

Segment::Segment(std::string name, int fd, const Geometry& geometry, int local_rank)
    : name_(std::move(name)), fd_(fd), geometry_(geometry), local_rank_(local_rank) {
  const std::size_t n = static_cast<std::size_t>(geometry.local_size);
  controls_ = round_up(sizeof(Header), kCacheLine);
  small_ = round_up(controls_ + n * sizeof(RankControl), kPage);
  chunks_ = small_ + n * 2 * geometry.small_bytes;
  results_ = chunks_ + n * 2 * geometry.chunk_bytes;
  fixed_ = round_up(results_ + 2 * geometry.chunk_bytes, kPage);
  arenas_ = fixed_;
  total_ = arenas_ + n * geometry.arena_bytes;
}

Segment::~Segment() {
  if (base_ != nullptr) munmap(base_, total_);
  if (fd_ >= 0) close(fd_);
}

std::unique_ptr<Segment> Segment::create(const std::string& name, const Geometry& geometry,
                                         int local_rank) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw Error("shm: cannot create shared-memory segment " + name +
                " (/dev/shm): " + errno_text() + " (DDP_BACKEND=gloo avoids shared memory)");
  }
  std::unique_ptr<Segment> segment(new Segment(name, fd, geometry, local_rank));
  try {
    if (ftruncate(fd, static_cast<off_t>(segment->total_)) != 0) {
      throw Error("shm: cannot size segment " + name + " to " +
                  std::to_string(segment->total_ >> 20) + " MiB: " + errno_text() +
                  " (DDP_SHM_ARENA_MB sets the sparse per-rank arena)");
    }
    // Allocate the fixed part now: a full /dev/shm fails here with ENOSPC
    // rather than with SIGBUS at first touch.
    int rc = posix_fallocate(fd, 0, static_cast<off_t>(segment->fixed_));
    if (rc != 0) {
      throw Error("shm: /dev/shm has no room for the " + std::to_string(segment->fixed_ >> 20) +
                  " MiB of segment " + name + ": " + std::strerror(rc) +
                  " (enlarge /dev/shm, e.g. docker --shm-size, or set DDP_BACKEND=gloo)");
    }
    segment->map_and_prefault(true);
  } catch (...) {
    shm_unlink(name.c_str());
    segment->unlinked_ = true;
    throw;
  }
  return segment;
}

std::unique_ptr<Segment> Segment::try_attach(const std::string& name, int local_rank,
                                             int local_size) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && errno == ENOENT) return nullptr;  // not made yet
  if (fd < 0) throw Error("shm: cannot open shared-memory segment " + name + ": " + errno_text());
  // The creator wrote the geometry in the header, the magic last: read it
  // before mapping the rest.
  SegmentFacts facts;
  const ssize_t got = pread(fd, &facts, sizeof facts, 0);
  if (got == 0 || (got == static_cast<ssize_t>(sizeof facts) && facts.magic == 0)) {
    close(fd);
    return nullptr;  // still being made
  }
  if (got != static_cast<ssize_t>(sizeof facts) || facts.magic != kMagic ||
      facts.local_size != static_cast<std::uint64_t>(local_size)) {
    close(fd);
    throw Error("shm: segment " + name + " is not a segment of " + std::to_string(local_size) +
                " local ranks");
  }
  Geometry g;
  g.local_size = local_size;
  g.small_bytes = facts.small_bytes;
  g.chunk_bytes = facts.chunk_bytes;
  g.arena_bytes = facts.arena_bytes;
  std::unique_ptr<Segment> segment(new Segment(name, fd, g, local_rank));
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != segment->total_ ||
      facts.total_bytes != segment->total_) {
    throw Error("shm: segment " + name +
                " has an unexpected size (not made by this libddp version?)");
  }
  segment->map_and_prefault(false);
  return segment;
}

void Segment::map_and_prefault(bool create) {
  void* p = mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    throw Error("shm: cannot map segment " + name_ + " (" + std::to_string(total_ >> 20) +
                " MiB): " + errno_text());
  }
  base_ = static_cast<char*>(p);
  if (create) {
    auto* header = new (base_) Header;
    // The magic last: attachers take a segment without it for one still
    // being made (its name is published before it exists).
    header->facts = SegmentFacts{0,
                                 static_cast<std::uint64_t>(geometry_.local_size),
                                 geometry_.small_bytes,
                                 geometry_.chunk_bytes,
                                 geometry_.arena_bytes,
                                 total_};
    for (int r = 0; r < geometry_.local_size; ++r) new (&control(r)) RankControl;
    // The creator's pid is there before anyone can attach: if it dies before
    // it marks itself attached (it pre-faults the segment first), the ranks
    // that attached see it die instead of waiting for it until the deadline.
    control(local_rank_).pid = static_cast<std::int32_t>(getpid());
    __atomic_store_n(&header->facts.magic, kMagic, __ATOMIC_RELEASE);
  }
  // Map every page of the fixed part into this process now.
#ifdef MADV_POPULATE_WRITE
  if (madvise(base_, fixed_, MADV_POPULATE_WRITE) == 0) return;
#endif
  // Older kernels: touch one byte per page (the slots are unused until the
  // first collective, and the header is only read here).
  for (std::size_t off = small_; off < fixed_; off += kPage) {
    volatile char* c = base_ + off;
    *c = *c;
  }
  for (std::size_t off = 0; off < small_; off += kPage) {
    volatile char* c = base_ + off;
    (void)*c;
  }
}

void Segment::carry_arena(int fd, const std::string& name) {
  if (name.size() >= kArenaNameBytes) throw Error("shm: arena name " + name + " is too long");
  void* p = mmap(base_ + arena_offset(local_rank_), geometry_.arena_bytes, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    throw Error("shm: cannot map this rank's carried arena " + name + " into segment " + name_ +
                ": " + errno_text());
  }
  carried_fd_ = fd;
  std::memcpy(control(local_rank_).arena_name, name.c_str(), name.size() + 1);
}

void Segment::map_carried_arenas() {
  for (int k = 0; k < geometry_.local_size; ++k) {
    RankControl& peer = control(k);
    (void)peer.attached.load(std::memory_order_acquire);  // the name is written before it
    if (k == local_rank_ || peer.arena_name[0] == '\0') continue;
    const std::string name(peer.arena_name, strnlen(peer.arena_name, kArenaNameBytes));
    const std::string whose = "local rank " + std::to_string(k) + "'s carried arena " + name;
    const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) throw Error("shm: cannot open " + whose + ": " + errno_text());
    struct stat st {};
    if (fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < geometry_.arena_bytes) {
      close(fd);
      throw Error("shm: " + whose + " is shorter than this segment's arenas (" +
                  std::to_string(geometry_.arena_bytes >> 20) +
                  " MiB): the ranks of this node have different DDP_SHM_ARENA_MB");
    }
    void* p = mmap(base_ + arena_offset(k), geometry_.arena_bytes, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED, fd, 0);
    const std::string why = errno_text();
    close(fd);
    if (p == MAP_FAILED)
      throw Error("shm: cannot map " + whose + " into segment " + name_ + ": " + why);
  }
}

void Segment::mark_attached() {
  RankControl& mine = control(local_rank_);
  mine.pid = static_cast<std::int32_t>(getpid());
  mine.attached.store(1, std::memory_order_release);
  header().attached.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(header().attached);
}

void Segment::wait_attached_and_unlink(std::chrono::steady_clock::time_point deadline) {
  const auto want = static_cast<std::uint32_t>(geometry_.local_size);
  bool all = false;
  for (;;) {
    // In slices: a rank that attached and then died, or the creator dying
    // before it marked itself attached (its pid is written with the segment),
    // ends the wait at once rather than at the deadline.
    const auto slice =
        std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(50));
    all = futex_wait_until(
        header().attached, [&](std::uint32_t n) { return n >= want; }, slice);
    if (all || std::chrono::steady_clock::now() >= deadline) break;
    for (int r = 0; r < geometry_.local_size; ++r) {
      const RankControl& peer = control(r);
      if (r == local_rank_) continue;
      // Acquire `attached` first: mark_attached() writes the pid before it.
      // A pid without `attached` is the creator's, written with the segment.
      (void)peer.attached.load(std::memory_order_acquire);
      if (peer.pid <= 0) continue;
      if (process_exited(peer.pid)) {
        unlink();
        throw Error("shm: local rank " + std::to_string(r) + " (pid " + std::to_string(peer.pid) +
                    ") exited while the ranks of this node were attaching to segment " + name_);
      }
    }
  }
  // Every rank has mapped it (or the setup failed): nobody needs the name,
  // and whichever rank survives removes it.
  unlink();
  if (!all) {
    std::string missing;
    for (int r = 0; r < geometry_.local_size; ++r) {
      if (control(r).attached.load(std::memory_order_acquire) == 0) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    throw Error("shm: local rank(s) " + missing + " did not attach to segment " + name_ +
                " in time");
  }
}

void Segment::unlink() {
  if (!unlinked_) shm_unlink(name_.c_str());  // ENOENT: another rank removed it first
  unlinked_ = true;
}

RankControl& Segment::control(int local_rank) const {
  return *reinterpret_cast<RankControl*>(
      base_ + controls_ + static_cast<std::size_t>(local_rank) * sizeof(RankControl));
}
char* Segment::small_slot(int local_rank, unsigned parity) const {
  return base_ + small_ +
         (static_cast<std::size_t>(local_rank) * 2 + (parity & 1)) * geometry_.small_bytes;
}
char* Segment::chunk_slot(int local_rank, unsigned parity) const {
  return base_ + chunks_ +
         (static_cast<std::size_t>(local_rank) * 2 + (parity & 1)) * geometry_.chunk_bytes;
}
char* Segment::result_slot(unsigned parity) const {
  return base_ + results_ + (parity & 1) * geometry_.chunk_bytes;
}
std::size_t Segment::arena_offset(int local_rank) const {
  return arenas_ + static_cast<std::size_t>(local_rank) * geometry_.arena_bytes;
}

std::int64_t Segment::offset_of(const void* p, std::size_t bytes) const {
  auto* c = static_cast<const char*>(p);
  if (c < base_ + arenas_ || c + bytes > base_ + total_ || c + bytes < c) return -1;
  return static_cast<std::int64_t>(c - base_);
}

}  // namespace ddp::shm
