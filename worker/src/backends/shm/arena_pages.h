#pragma once
// Pages of one rank's arena (internal to the shm backend): taken for a
// call's scratch and for allocate()'s blocks, faulted in at once, and given
// back with their pages. Thread-safe through the pool's mutex.

#include <cstddef>
#include <optional>
#include <string>

#include "backends/shm/carried_arena.h"

namespace ddp::shm {

// Where a rank's arena is: in the segment (or the arena it carries, mapped
// there), or on its own for a rank alone on its node.
struct ArenaView {
  ArenaPool& pool;
  int fd;                   // the file holding its pages
  std::size_t file_offset;  // where the arena starts in that file
  char* base;               // where the arena starts in this process
  std::size_t bytes;
};

// Takes `bytes` of the arena and faults its pages in now, so a full
// /dev/shm is ENOSPC here rather than SIGBUS later; `zeroed`: whatever an
// earlier block left there is dropped first. The offset in the arena, or
// nullopt with the reason in `why`.
std::optional<std::size_t> take_pages(const ArenaView& arena, std::size_t bytes, std::string* why,
                                      bool zeroed = false);

// Returns take_pages' block and its pages (scratch is not kept resident).
void give_pages_back(const ArenaView& arena, std::size_t offset, std::size_t bytes);

}  // namespace ddp::shm
