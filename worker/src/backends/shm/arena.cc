#include "backends/shm/arena.h"

#include <iterator>
#include <string>

#include "ddp/common/error.h"

namespace ddp::shm {

ArenaAllocator::ArenaAllocator(std::size_t capacity, std::size_t alignment)
    : capacity_(capacity / alignment * alignment), alignment_(alignment) {
  if (capacity_ > 0) free_.emplace(0, capacity_);
}

std::optional<std::size_t> ArenaAllocator::take(std::size_t bytes) {
  std::size_t size = (std::max<std::size_t>(bytes, 1) + alignment_ - 1) / alignment_ * alignment_;
  if (size < bytes) return std::nullopt;  // overflow
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < size) continue;
    std::size_t offset = it->first, left = it->second - size;
    free_.erase(it);
    if (left > 0) free_.emplace(offset + size, left);
    used_.emplace(offset, size);
    return offset;
  }
  return std::nullopt;
}

void ArenaAllocator::give_back(std::size_t offset) {
  auto used = used_.find(offset);
  if (used == used_.end())
    throw Error("shm arena: offset " + std::to_string(offset) + " was not allocated");
  std::size_t size = used->second;
  used_.erase(used);
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + size == next->first) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += size;
      return;
    }
  }
  free_.emplace(offset, size);
}

std::size_t ArenaAllocator::free_bytes() const {
  std::size_t total = 0;
  for (const auto& [offset, size] : free_) total += size;
  return total;
}

}  // namespace ddp::shm
