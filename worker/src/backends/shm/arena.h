#pragma once
// First-fit allocation of offsets inside one rank's arena of the segment
// (pure bookkeeping, no memory touched; internal to the shm backend). Blocks
// are page-aligned; freed neighbours merge. Not thread-safe.

#include <cstddef>
#include <map>
#include <optional>

namespace ddp::shm {

class ArenaAllocator {
 public:
  explicit ArenaAllocator(std::size_t capacity, std::size_t alignment = 4096);
  // The offset of a free block of at least `bytes` (0 counts as 1), or nullopt when none is left.
  std::optional<std::size_t> take(std::size_t bytes);
  // Returns a block from take(). Throws ddp::Error for an offset it did not hand out.
  void give_back(std::size_t offset);
  std::size_t free_bytes() const;

 private:
  std::size_t capacity_, alignment_;
  std::map<std::size_t, std::size_t> free_;  // offset -> size, no two adjacent
  std::map<std::size_t, std::size_t> used_;  // offset -> size
};

}  // namespace ddp::shm
