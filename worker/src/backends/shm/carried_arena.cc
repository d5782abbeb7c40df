#include "backends/shm/carried_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

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

namespace {

// The heir's file renamed to `name`, open; -1 when there is none of `bytes`.
int take_over(const std::string& heir, const std::string& name, std::size_t bytes) {
  if (heir.empty()) return -1;
  // shm_open's names are files of /dev/shm (glibc on Linux).
  if (std::rename(("/dev/shm" + heir).c_str(), ("/dev/shm" + name).c_str()) != 0) return -1;
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  struct stat st {};
  if (fd >= 0 && fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) == bytes) return fd;
  if (fd >= 0) close(fd);
  shm_unlink(name.c_str());
  return -1;
}

}  // namespace

std::unique_ptr<CarriedArena> CarriedArena::make(const std::string& name, std::size_t bytes,
                                                 const std::string& heir) {
  if (const int fd = take_over(heir, name, bytes); fd >= 0) {
    std::unique_ptr<CarriedArena> arena(new CarriedArena(name, fd, bytes));
    arena->inherited_ = true;
    return arena;
  }
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw Error("shm: cannot create this process's carried arena " + name +
                " (/dev/shm): " + std::strerror(errno));
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const std::string why = std::strerror(errno);
    shm_unlink(name.c_str());
    close(fd);
    throw Error("shm: cannot size the carried arena " + name + " to " +
                std::to_string(bytes >> 20) + " MiB: " + why);
  }
  return std::unique_ptr<CarriedArena>(new CarriedArena(name, fd, bytes));
}

std::size_t CarriedArena::resident_bytes() const {
  struct stat st {};
  return fstat(fd_, &st) == 0 ? static_cast<std::size_t>(st.st_blocks) * 512 : 0;
}

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

}  // namespace ddp::shm
