#pragma once
// The arena a process carries from one shm group to the next (internal to
// the shm backend; ProcessGroupOptions::shm_carry_arena).
//
// A group's segment normally holds every rank's arena, so a rebuilt group
// (live recovery: a new segment per epoch) starts from fresh pages, which
// the kernel must zero: about 1 GB/s on a busy virtual machine, seconds for
// a large model's gradient buckets, and freeing the old segment costs as
// much again. A carried arena is instead one sparse file per process, mapped
// into each of its groups' segments at that rank's arena (and by the peers
// there), so the pages a block had in the last group are the pages it has in
// the next. Its name (shm_names.h) lives while the process does: removed at
// exit; when the process dies, ddprun renames it for the process it
// relaunches in its place (which takes it over, pages and all), and its
// sweep of the run's segments removes whatever is left when a job ends.

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

#include "backends/shm/arena.h"

namespace ddp::shm {

// The offsets of one arena handed out to a process's blocks, behind a lock:
// per segment, or one for a process's carried arena (every group using it
// takes from it, so no two blocks overlap in the file).
struct ArenaPool {
  explicit ArenaPool(std::size_t capacity) : allocator(capacity) {}
  std::mutex mu;
  ArenaAllocator allocator;
};

class CarriedArena {
 public:
  // This process's carried arena of `bytes` (sparse), made on first use
  // (see make(); `heir`: the arena ddprun left for this process, "" none) and
  // named under `run_id`'s prefix; kept until the process exits. nullptr when
  // the arena this process made earlier has another size (a group whose
  // geometry differs keeps its arena in its segment). Throws ddp::Error
  // naming the file when /dev/shm refuses it.
  static std::shared_ptr<CarriedArena> get(const std::string& run_id, std::size_t bytes,
                                           const std::string& heir);

  // An arena of `bytes` named `name` (shm_open's form): the file `heir`
  // renamed when it exists with that size (the arena of the process this
  // one replaces, with its pages), else a new one (a misfit `heir` is
  // removed). Throws ddp::Error naming the file when /dev/shm refuses it.
  static std::unique_ptr<CarriedArena> make(const std::string& name, std::size_t bytes,
                                            const std::string& heir);
  // Whether make() took over an heir's arena.
  bool inherited() const { return inherited_; }
  // Bytes of the file that have pages.
  std::size_t resident_bytes() const;

  ~CarriedArena();
  CarriedArena(const CarriedArena&) = delete;
  CarriedArena& operator=(const CarriedArena&) = delete;

  const std::string& name() const { return name_; }
  int fd() const { return fd_; }
  std::size_t bytes() const { return bytes_; }
  const std::shared_ptr<ArenaPool>& pool() const { return pool_; }

 private:
  CarriedArena(std::string name, int fd, std::size_t bytes);

  std::string name_;
  int fd_;
  std::size_t bytes_;
  pid_t owner_;  // the process that made it (and removes its name)
  bool inherited_ = false;
  std::shared_ptr<ArenaPool> pool_;
};

// A carried arena mapped on its own: the arena of a rank alone on its node
// (a group that shrank to one rank there), which has no segment to map it
// into. Its blocks come from the carried arena's pool, so they get the pages
// the process's last group's blocks had, and a later group's never overlap
// them.
class LoneArena {
 public:
  // Maps all of `carried` (sparse: no pages are made). Throws ddp::Error
  // naming the file when it cannot be mapped.
  explicit LoneArena(std::shared_ptr<CarriedArena> carried);
  ~LoneArena();
  LoneArena(const LoneArena&) = delete;
  LoneArena& operator=(const LoneArena&) = delete;

  char* base() const { return base_; }
  const CarriedArena& carried() const { return *carried_; }

 private:
  std::shared_ptr<CarriedArena> carried_;
  char* base_;
};

}  // namespace ddp::shm
