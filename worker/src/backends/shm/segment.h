#pragma once
// The shared-memory segment of the ranks of one node (internal to the shm
// backend): its layout, creation by local rank 0, attachment by the others.
//
// Layout, every part 64-byte aligned and the data parts page-aligned:
//   Header | RankControl[local_size] | small slots [local_size][2] |
//   chunk slots [local_size][2] | result slots [2] | arenas [local_size]
// Everything before the arenas is allocated and pre-faulted when the segment
// is created and attached (first touch costs 3-4x on the first collective).
// The arenas are sparse: a rank's arena gets pages only when allocate()
// hands part of it out. A rank may carry its arena in a file of its own
// (carried_arena.h): that file is then mapped over its arena's place, by
// every rank. The name is unlinked as soon as every rank attached.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "backends/shm/algorithms.h"
#include "backends/shm/learned_choices.h"
#include "core/phase_sync.h"

namespace ddp::shm {

struct Geometry {
  int local_size = 1;
  std::size_t small_bytes = 32 << 10;  // per rank and parity: the single-copy path
  std::size_t chunk_bytes =
      256 << 10;  // per rank and parity: the pipelined path's chunk (fits L2 with its peers)
  std::size_t arena_bytes = std::size_t{2} << 30;  // per rank, sparse: allocate()

  // Defaults, with DDP_SHM_CHUNK_KB and DDP_SHM_ARENA_MB applied (errors name the
  // variable); chunk_bytes > 0 (ProcessGroupOptions::shm_chunk_bytes) replaces
  // DDP_SHM_CHUNK_KB (an error names the option when it is under 64 KiB).
  static Geometry from_env(int local_size, std::size_t chunk_bytes = 0);
};

// What a rank says about the collective it is in (published with its first phase).
struct alignas(kCacheLine) Descriptor {
  std::uint32_t kind = 0;  // which collective
  std::uint32_t dtype = 0;
  std::uint64_t bytes = 0;
  std::int64_t offset = -1;  // of the rank's buffer in the segment, -1 if private
  std::int32_t root = -1;
  std::int32_t op = -1;
  std::int64_t input_offset = -1;  // all_gather: of the rank's input in the segment, -1 if private
  std::uint16_t algorithm = 0;     // the shm::Algorithm chosen for this call
  std::uint16_t timing = 0;        // 1: a run on scratch buffers while the ranks time the variants
  std::uint32_t forced = 0;        // the rank's DDP_SHM_ALGO (Forced::packed): ranks must agree
  std::uint32_t budget_us =
      0;  // the rank's DDP_SHM_TUNE_BUDGET_MS, in microseconds: ranks must agree
};

constexpr std::size_t kArenaNameBytes = 192;

struct alignas(kCacheLine) RankControl {
  PhaseWord word;
  Descriptor
      descriptor[2];  // by collective parity: a fast rank never overwrites one still being read
  alignas(kCacheLine) double timings[kMaxVariants] =
      {};  // seconds per candidate while choosing an algorithm
  std::int32_t pid = 0;
  std::atomic<std::uint32_t> attached{0};
  char arena_name[kArenaNameBytes] = {};  // the rank's carried arena; empty: in the segment
  PackedChoices learned = {};             // what the rank's process timed in its earlier groups
};

// Written once by the creator, read by attachers before they map the rest.
struct SegmentFacts {
  std::uint64_t magic = 0;
  std::uint64_t local_size = 0;
  std::uint64_t small_bytes = 0, chunk_bytes = 0, arena_bytes = 0, total_bytes = 0;
};

struct alignas(kCacheLine) Header {
  SegmentFacts facts;
  std::atomic<std::uint32_t> attached{0};  // ranks that mapped the segment (futex word)
};

class Segment {
 public:
  // Creates the segment (O_EXCL), sizes and pre-faults it. Throws ddp::Error
  // naming the segment and /dev/shm when it cannot (e.g. no room).
  static std::unique_ptr<Segment> create(const std::string& name, const Geometry& geometry,
                                         int local_rank);
  // Maps the segment and pre-faults its fixed part; nullptr while it does
  // not exist yet or its creator has not finished it (its name is published
  // first). Throws ddp::Error naming it when it is not a segment of
  // `local_size` ranks made by this version, or cannot be opened or mapped.
  static std::unique_ptr<Segment> try_attach(const std::string& name, int local_rank,
                                             int local_size);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Before mark_attached(): this rank's arena is the file `fd` (named `name`,
  // at least arena_bytes long), mapped over its place here and published for
  // the peers. Throws ddp::Error naming the file when it cannot be.
  void carry_arena(int fd, const std::string& name);
  // Records this rank as attached (pid, counter) and wakes the creator.
  void mark_attached();
  // After wait_attached_and_unlink(): maps the arenas the peers carry over
  // their places. Throws ddp::Error naming the local rank and the file when
  // one cannot be opened or is too short.
  void map_carried_arenas();
  // Every rank: waits until every rank attached, then removes the name (the
  // first to get there does; a rank that dies during setup leaves nothing
  // behind as long as one survives). Throws ddp::Error naming the local
  // ranks that had not attached by `deadline`, or at once one that attached
  // and exited (the name is removed either way).
  void wait_attached_and_unlink(std::chrono::steady_clock::time_point deadline);

  const std::string& name() const { return name_; }
  const Geometry& geometry() const { return geometry_; }
  Header& header() const { return *reinterpret_cast<Header*>(base_); }
  RankControl& control(int local_rank) const;
  char* small_slot(int local_rank, unsigned parity) const;
  char* chunk_slot(int local_rank, unsigned parity) const;
  char* result_slot(unsigned parity) const;
  std::size_t arena_offset(int local_rank) const;
  // This rank's arena in its file: the descriptor and where the arena
  // begins in it (the segment's, or the carried arena's at 0).
  int arena_fd() const { return carried_fd_ >= 0 ? carried_fd_ : fd_; }
  std::size_t arena_file_offset() const { return carried_fd_ >= 0 ? 0 : arena_offset(local_rank_); }
  char* base() const { return base_; }
  int fd() const { return fd_; }
  // Offset of [p, p + bytes) when it lies inside some rank's arena, else -1.
  std::int64_t offset_of(const void* p, std::size_t bytes) const;

 private:
  Segment(std::string name, int fd, const Geometry& geometry, int local_rank);
  void map_and_prefault(bool create);
  void unlink();  // removes the name once (the mapping stays)

  std::string name_;
  int fd_ = -1;
  Geometry geometry_;
  int local_rank_;
  char* base_ = nullptr;
  std::size_t total_ = 0, fixed_ = 0;
  std::size_t controls_ = 0, small_ = 0, chunks_ = 0, results_ = 0, arenas_ = 0;
  bool unlinked_ = false;
  int carried_fd_ = -1;  // this rank's carried arena (not owned), -1: in the segment
};

}  // namespace ddp::shm
