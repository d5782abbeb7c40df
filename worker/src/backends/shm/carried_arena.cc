#include "backends/shm/carried_arena.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/carried_file.h"
#include "ddp/common/error.h"
#include "ddp/common/random_id.h"
#include "ddp/common/shm_names.h"

namespace ddp::shm {

CarriedArena::CarriedArena(std::string name, int fd, std::size_t bytes)
    : name_(std::move(name)),
      fd_(fd),
      bytes_(bytes),
      owner_(getpid()),
      pool_(std::make_shared<ArenaPool>(bytes)) {}

CarriedArena::~CarriedArena() {
  if (getpid() == owner_) shm_unlink(name_.c_str());  // not a forked child's to remove
  close(fd_);
}

std::unique_ptr<CarriedArena> CarriedArena::make(const std::string& name, std::size_t bytes,
                                                 const std::string& heir) {
  const detail::CarriedFile file =
      detail::make_carried_file(name, bytes, heir, "shm: this process's carried arena");
  std::unique_ptr<CarriedArena> arena(new CarriedArena(name, file.fd, bytes));
  arena->inherited_ = file.inherited;
  return arena;
}

std::size_t CarriedArena::resident_bytes() const { return detail::resident_bytes(fd_); }

std::shared_ptr<CarriedArena> CarriedArena::get(const std::string& run_id, std::size_t bytes,
                                                const std::string& heir) {
  // Never released before exit: the next group of this process finds it.
  static std::mutex mu;
  static std::shared_ptr<CarriedArena> held;
  std::lock_guard<std::mutex> lock(mu);
  if (held && held->owner_ != getpid()) held.reset();  // a forked child makes its own
  if (held) return held->bytes_ == bytes ? held : nullptr;
  held = make(shm_arena_name(run_id, getpid(), random_hex(8)), bytes, heir);
  return held;
}

LoneArena::LoneArena(std::shared_ptr<CarriedArena> carried) : carried_(std::move(carried)) {
  void* p = mmap(nullptr, carried_->bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, carried_->fd(), 0);
  if (p == MAP_FAILED) {
    throw Error("shm: cannot map this rank's carried arena " + carried_->name() + ": " +
                std::strerror(errno));
  }
  base_ = static_cast<char*>(p);
}

LoneArena::~LoneArena() { munmap(base_, carried_->bytes()); }

}  // namespace ddp::shm
