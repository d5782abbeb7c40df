// Healer::state_memory(): the program's state in a file that ddprun hands to
// the process it relaunches in this one's place.

#include "heal/state_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "core/carried_file.h"
#include "core/init_parts.h"
#include "ddp/common/error.h"
#include "ddp/common/random_id.h"
#include "ddp/common/shm_names.h"
#include "ddp/heal.h"
#include "ddp/log.h"

namespace ddp {
namespace {

// The process's one carried block: reserved before its file exists (a
// second state_memory() meanwhile gets private memory), placed once mapped
// (for state_memory_place()), released when the program lets it go.
struct CarriedBlock {
  std::mutex mu;
  bool held = false;
  const char* base = nullptr;
  std::size_t bytes = 0;
  std::string name;
};
CarriedBlock& carried_block() {
  static CarriedBlock block;
  return block;
}
bool reserve_carried_block() {
  CarriedBlock& block = carried_block();
  std::lock_guard<std::mutex> lock(block.mu);
  if (block.held) return false;
  block.held = true;
  return true;
}
void place_carried_block(const char* base, std::size_t bytes, const std::string& name) {
  CarriedBlock& block = carried_block();
  std::lock_guard<std::mutex> lock(block.mu);
  block.base = base;
  block.bytes = bytes;
  block.name = name;
}
void release_carried_block() {
  CarriedBlock& block = carried_block();
  std::lock_guard<std::mutex> lock(block.mu);
  block.held = false;
  block.base = nullptr;
  block.bytes = 0;
  block.name.clear();
}

std::shared_ptr<void> map_or_throw(std::size_t bytes, int flags, int fd, const std::string& what) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, fd, 0);
  if (p == MAP_FAILED) {
    throw Error("heal: cannot map " + std::to_string(bytes) + " bytes of state memory (" + what +
                "): " + std::strerror(errno));
  }
  return std::shared_ptr<void>(p, [bytes](void* q) { munmap(q, bytes); });
}

}  // namespace

namespace detail {

// Its pages exist: mapping each chunk's at once costs a fraction of faulting
// them in one by one (0.17 s instead of 0.75 s for 1 GiB on a busy 2-vCPU
// machine). Not zeroing them saves more (1 GiB on an idle one: 150 ms mapped
// and zeroed, 65 ms mapped for writing). In chunks, not MAP_POPULATE, which
// holds the process's memory map while it runs: the Healer's thread, asking
// to join meanwhile, could not allocate.
void ready_inherited(char* p, std::size_t bytes, Healer::StateFill fill) {
  constexpr std::size_t kChunk = std::size_t{64} << 20;
  for (std::size_t at = 0; at < bytes; at += kChunk) {
    const std::size_t n = std::min(kChunk, bytes - at);
    if (fill == Healer::StateFill::kZeros) {
#ifdef MADV_POPULATE_READ
      madvise(p + at, n, MADV_POPULATE_READ);  // best effort: memset faults what it left
#endif
      std::memset(p + at, 0, n);
    } else {
#ifdef MADV_POPULATE_WRITE
      madvise(p + at, n, MADV_POPULATE_WRITE);  // best effort: the first writes fault the rest
#endif
    }
  }
}

}  // namespace detail

std::shared_ptr<void> Healer::state_memory(std::size_t bytes, StateFill fill) {
  if (bytes == 0) throw Error("heal: state_memory() needs a size above 0 bytes");
  const auto& env = detail::worker_env();
  if (!requested() || !reserve_carried_block())
    return map_or_throw(bytes, MAP_PRIVATE | MAP_ANONYMOUS, -1, "private");
  const std::string name = shm_state_name(env->run_id, getpid(), random_hex(8));
  const std::string heir = env->incarnation > 0 ? shm_state_heir_name(env->run_id, env->rank) : "";
  detail::CarriedFile file;
  std::size_t resident = 0;  // bytes of an inherited file with pages
  std::shared_ptr<void> mapped;
  const auto give_up = [&] {
    if (file.fd >= 0) {
      shm_unlink(name.c_str());
      close(file.fd);
      file.fd = -1;
    }
    release_carried_block();
  };
  try {
    file = detail::make_carried_file(name, bytes, heir, "heal: this process's state memory");
    resident = file.inherited ? detail::resident_bytes(file.fd) : 0;
    // The file's pages are reserved now (unless an inherited file has them
    // all), so a /dev/shm too small for them (a container's 64 MiB, say)
    // says so here rather than with SIGBUS at first touch; the state then
    // lives in private memory.
    const int rc = resident >= bytes ? 0 : posix_fallocate(file.fd, 0, static_cast<off_t>(bytes));
    if (rc != 0) {
      give_up();
      log::write(log::Level::kWarn, true,
                 fmt::format("heal: /dev/shm has no room for {:.1f} MiB of state memory ({}): "
                             "private memory instead, which a relaunch cannot inherit",
                             static_cast<double>(bytes) / (1 << 20), std::strerror(rc)));
      return map_or_throw(bytes, MAP_PRIVATE | MAP_ANONYMOUS, -1, "private");
    }
    mapped = map_or_throw(bytes, MAP_SHARED, file.fd, name);
  } catch (...) {
    give_up();
    throw;
  }
  if (file.inherited) {
    detail::ready_inherited(static_cast<char*>(mapped.get()), bytes, fill);
    log::write(log::Level::kInfo, true,
               fmt::format("heal: took over the state memory of the process this one replaces "
                           "({:.1f} MiB of pages made{})",
                           static_cast<double>(resident) / (1 << 20),
                           fill == StateFill::kZeros ? "" : ", not zeroed"));
  }
  close(file.fd);  // the mapping keeps the file
  const pid_t owner = getpid();
  place_carried_block(static_cast<const char*>(mapped.get()), bytes, name);
  return std::shared_ptr<void>(mapped.get(), [mapped, name, owner](void*) mutable {
    release_carried_block();  // before the unmap: no reader may be pointed at it after
    mapped.reset();
    if (getpid() == owner) shm_unlink(name.c_str());  // not a forked child's to remove
  });
}

namespace detail {

std::optional<StatePlace> state_memory_place(const void* p, std::size_t bytes) {
  CarriedBlock& block = carried_block();
  std::lock_guard<std::mutex> lock(block.mu);
  const auto* at = static_cast<const char*>(p);
  if (!block.base || at < block.base || at > block.base + block.bytes ||
      bytes > static_cast<std::size_t>(block.base + block.bytes - at)) {
    return std::nullopt;
  }
  return StatePlace{block.name, static_cast<std::size_t>(at - block.base)};
}

}  // namespace detail

}  // namespace ddp
