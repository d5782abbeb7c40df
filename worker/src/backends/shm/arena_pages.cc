// Pages of this rank's arena in the segment: taken for a call's scratch and
// for allocate()'s blocks, and given back.

#include "backends/shm/shm_backend.h"

namespace ddp::shm_backend {

std::optional<std::size_t> ShmBackend::take_pages(std::size_t bytes, std::string* why,
                                                  bool zeroed) {
  std::lock_guard<std::mutex> lock(state_->mu);
  const auto offset = state_->arena->take(bytes);
  if (!offset) {
    *why = "this rank's " + std::to_string(segment().geometry().arena_bytes >> 20) +
           " MiB arena is used up (DDP_SHM_ARENA_MB)";
    return std::nullopt;
  }
  const std::size_t at = segment().arena_offset(me_) + *offset, len = page_rounded(bytes);
  if (zeroed) fallocate(segment().fd(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, at, len);
  const int rc = posix_fallocate(segment().fd(), static_cast<off_t>(at), static_cast<off_t>(len));
  if (rc != 0) {
    state_->arena->give_back(*offset);
    *why = "/dev/shm has no room: " + std::string(std::strerror(rc));
    return std::nullopt;
  }
  char* p = segment().base() + at;
#ifdef MADV_POPULATE_WRITE
  if (madvise(p, len, MADV_POPULATE_WRITE) != 0) std::memset(p, 0, len);
#else
  std::memset(p, 0, len);
#endif
  return offset;
}

void ShmBackend::give_pages_back(std::size_t offset, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(state_->mu);
  fallocate(segment().fd(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
            static_cast<off_t>(segment().arena_offset(me_) + offset),
            static_cast<off_t>(page_rounded(bytes)));
  state_->arena->give_back(offset);
}

}  // namespace ddp::shm_backend
