// Pages of this rank's arena in the segment (or in the arena it carries):
// taken for a call's scratch and for allocate()'s blocks, and given back.

#include <algorithm>
#include <thread>
#include <vector>

#include "backends/shm/arena_pages.h"

#include <fcntl.h>
#include <sys/mman.h>

#include <cstring>
#include <mutex>

namespace ddp::shm {
namespace {

// Maps [p, p + len) into this process, faulting in (and, for fresh pages,
// zeroing) every page. The kernel does that one page at a time, about 1 GB/s
// on a busy virtual machine: a block of hundreds of MiB (a model's gradient
// buckets) is split over the machine's cores.
void populate(char* p, std::size_t len) {
  constexpr std::size_t kPerThread = std::size_t{32} << 20;
  const auto one = [](char* at, std::size_t n) {
#ifdef MADV_POPULATE_WRITE
    if (madvise(at, n, MADV_POPULATE_WRITE) == 0) return;
#endif
    std::memset(at, 0, n);
  };
  const std::size_t cores = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t parts = std::min(cores, len / kPerThread);
  if (parts < 2) return one(p, len);
  const std::size_t per = (len / parts + 4095) / 4096 * 4096;
  std::vector<std::thread> helpers;
  for (std::size_t k = 1; k < parts; ++k) {
    const std::size_t at = k * per;
    if (at < len) helpers.emplace_back(one, p + at, std::min(per, len - at));
  }
  one(p, std::min(per, len));
  for (auto& t : helpers) t.join();
}

std::size_t page_rounded(std::size_t bytes) {
  return (std::max<std::size_t>(bytes, 1) + 4095) / 4096 * 4096;
}

}  // namespace

std::optional<std::size_t> take_pages(const ArenaView& arena, std::size_t bytes, std::string* why,
                                      bool zeroed) {
  std::lock_guard<std::mutex> lock(arena.pool.mu);
  const auto offset = arena.pool.allocator.take(bytes);
  if (!offset) {
    *why = "this rank's " + std::to_string(arena.bytes >> 20) +
           " MiB arena is used up (DDP_SHM_ARENA_MB)";
    return std::nullopt;
  }
  const std::size_t len = page_rounded(bytes);
  const auto at = static_cast<off_t>(arena.file_offset + *offset);
  if (zeroed) fallocate(arena.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, at, len);
  const int rc = posix_fallocate(arena.fd, at, static_cast<off_t>(len));
  if (rc != 0) {
    arena.pool.allocator.give_back(*offset);
    *why = "/dev/shm has no room: " + std::string(std::strerror(rc));
    return std::nullopt;
  }
  populate(arena.base + *offset, len);
  return offset;
}

void give_pages_back(const ArenaView& arena, std::size_t offset, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(arena.pool.mu);
  fallocate(arena.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
            static_cast<off_t>(arena.file_offset + offset),
            static_cast<off_t>(page_rounded(bytes)));
  arena.pool.allocator.give_back(offset);
}

}  // namespace ddp::shm
