#pragma once
// The shm backend (internal to libddp): collectives among the ranks of one
// node through a shared segment (segment.h) at memory speed; hierarchical
// all-reduce across nodes (Gloo between ranks of the same local rank); Gloo
// for everything else. One class shares the segment, the phase counter and
// the parities; its members are defined one job per file: setup and errors
// (shm_backend.cc), the variant each call runs (tuning.cc), each collective
// (all_reduce.cc, broadcast.cc, all_gather.cc, reduce_scatter.cc) and the
// pages of this rank's arena (arena_pages.cc).
//
// Every collective is a sequence of phases (shm/sync.h). Buffers in the
// segment are double-buffered by parity, and every collective step follows
// one rule: a rank writes its slot before a phase and peers read it after
// that phase, finishing before they arrive at any later phase; a slot's next
// write of the same parity comes two steps later, after a phase every reader
// arrived at only once done. So no step needs a phase of its own to release
// its buffers. A collective's first phase also publishes what each rank is
// doing (a Descriptor) so a mismatch is an error, not corrupt data.
//
// all_reduce, reduce_scatter, all_gather and broadcast have named variants
// (shm/algorithms.h): forced by DDP_SHM_ALGO, or timed by every local rank
// at the first call of each size class and agreed from one table
// (algorithm_for_call, choose_by_timing), optionally kept in DDP_SHM_TUNE_FILE.

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include "backends/shm/arena.h"
#include "backends/shm/carried_arena.h"
#include "backends/shm/segment.h"
#include "backends/shm/sync.h"
#include "backends/shm/tune_file.h"
#include "core/backend.h"
#include "core/process_identity.h"
#include "ddp/common/error.h"
#include "ddp/common/random_id.h"
#include "ddp/common/shm_names.h"
#include "ddp/log.h"
#include "kernels/reduce_kernels.h"

namespace ddp::shm_backend {

using Clock = std::chrono::steady_clock;
using shm::Descriptor;

constexpr std::size_t kFuseBytes = 16 << 10;  // reduce-then-copy block of the private path

enum class Kind : std::uint32_t {
  kAllReduce = 1,
  kBroadcast,
  kReduce,
  kAllGather,
  kBarrier,
  kReduceScatter
};

inline const char* kind_name(std::uint32_t kind) {
  switch (static_cast<Kind>(kind)) {
    case Kind::kAllReduce:
      return "all_reduce";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kReduce:
      return "reduce";
    case Kind::kAllGather:
      return "all_gather";
    case Kind::kBarrier:
      return "barrier";
    case Kind::kReduceScatter:
      return "reduce_scatter";
  }
  return "an unknown collective";
}

inline std::string describe(const Descriptor& d) {
  std::string text = kind_name(d.kind);
  if (static_cast<Kind>(d.kind) == Kind::kBarrier) return text;
  text += " of " + std::to_string(d.bytes) + " bytes of " + dtype_name(static_cast<DType>(d.dtype));
  if (d.op >= 0) text += " (" + std::string(op_name(static_cast<ReduceOp>(d.op))) + ")";
  if (d.root >= 0) text += " from root " + std::to_string(d.root);
  if (d.timing != 0) text += " (while timing its algorithms)";
  return text;
}

// Elements [lo, hi) of part `k` when `count` are split into `parts`, every
// boundary on a cache line (no two ranks write one line).
struct Slice {
  std::size_t lo, hi;
  std::size_t size() const { return hi - lo; }
};
inline Slice slice_of(std::size_t count, int parts, int k, std::size_t element) {
  const std::size_t align = std::max<std::size_t>(1, shm::kCacheLine / element);
  const std::size_t per = ((count + parts - 1) / parts + align - 1) / align * align;
  const std::size_t lo = std::min(count, per * static_cast<std::size_t>(k));
  return {lo, std::min(count, lo + per)};
}

using shm::Algorithm;
using shm::Collective;

// What DDP_SHM_ALGO (or the group's shm_algorithm option, which wins) forces.
inline shm::Forced forced_from(const std::string& option) {
  if (!option.empty()) return shm::parse_forced(option, "process group option shm_algorithm");
  const char* text = std::getenv("DDP_SHM_ALGO");
  return shm::parse_forced(text == nullptr ? "" : text, "environment variable DDP_SHM_ALGO");
}

// DDP_SHM_TUNE_BUDGET_MS, in milliseconds.
inline double budget_from_env() {
  const char* text = std::getenv("DDP_SHM_TUNE_BUDGET_MS");
  return shm::parse_timing_budget(text == nullptr ? "" : text);
}

inline Kind kind_of(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return Kind::kAllReduce;
    case Collective::kReduceScatter:
      return Kind::kReduceScatter;
    case Collective::kAllGather:
      return Kind::kAllGather;
    case Collective::kBroadcast:
      return Kind::kBroadcast;
  }
  return Kind::kBarrier;
}

// Where a variant that reads or writes other ranks' buffers can run: `pull`
// needs the buffers it reads in the segment, `push` those it writes; a
// variant that cannot run falls to the other in-place one, then to chunked.
inline Algorithm runnable(Algorithm wanted, bool can_pull, bool can_push) {
  if (wanted == Algorithm::kPull)
    return can_pull ? wanted : can_push ? Algorithm::kPush : Algorithm::kChunked;
  if (wanted == Algorithm::kPush)
    return can_push ? wanted : can_pull ? Algorithm::kPull : Algorithm::kChunked;
  return Algorithm::kChunked;
}

// The segment, its allocator and this rank's place in it. Shared with the
// deleters of allocate()'s blocks, so the mapping outlives the backend while
// a block is still held.
struct SharedState {
  std::shared_ptr<shm::CarriedArena> carried;  // null: this rank's arena is in the segment
  std::shared_ptr<shm::ArenaPool> pool;        // this rank's arena's offsets
  std::unique_ptr<shm::Segment> segment;
  // offer_node_shared()'s blocks: they go with the segment, so a carried
  // arena takes them back when this rank's last use of the segment ends.
  std::vector<std::size_t> node_shared;
  ~SharedState() {
    if (!pool) return;
    std::lock_guard<std::mutex> lock(pool->mu);
    for (std::size_t offset : node_shared) pool->allocator.give_back(offset);
  }
};

class ShmBackend final : public Backend {
 public:
  explicit ShmBackend(const BackendConfig& config);

  void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) override {
    all_reduce_impl(data, count, dtype, op, nullptr);
  }

  void all_reduce_partial(void* data, std::size_t count, DType dtype, ReduceOp op,
                          const std::vector<ElementRange>& needed) override;

  // `needed` (all_reduce_partial) only changes the in-place path on one node;
  // every other path reduces everything.
  void all_reduce_impl(void* data, std::size_t count, DType dtype, ReduceOp op,
                       const std::vector<ElementRange>* needed);

  void broadcast(void* data, std::size_t count, DType dtype, int root) override;

  void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) override;

  void all_gather(const void* in, void* out, std::size_t count, DType dtype) override;

  void barrier() override;

  // Not implemented in shared memory: Gloo's, over the whole group.
  void gather(const void* in, void* out, std::size_t count, DType dtype, int root) override {
    guarded([&] { fallback().gather(in, out, count, dtype, root); });
  }
  void scatter(const void* in, void* out, std::size_t count, DType dtype, int root) override {
    guarded([&] { fallback().scatter(in, out, count, dtype, root); });
  }
  void all_to_all(const void* in, void* out, std::size_t count, DType dtype) override {
    guarded([&] { fallback().all_to_all(in, out, count, dtype); });
  }
  // Rank r's `out` = block r of every rank's `in`, reduced. Across nodes: Gloo.
  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype,
                      ReduceOp op) override;

  // A block of local rank 0's arena, never given back (other ranks may still
  // use it when rank 0 drops its reference): it goes with the segment.
  std::int64_t offer_node_shared(std::size_t bytes) override;

  std::shared_ptr<void> node_shared_at(std::int64_t offset, std::size_t bytes) override;

  std::shared_ptr<void> allocate(std::size_t bytes) override;
  // Alone on its node under shm_carry_arena: allocate() takes from the carried arena.
  bool carries_lone_arena() const { return lone_ != nullptr; }

  std::string algorithm_for(const std::string& collective, std::size_t bytes) const override;

  // The node's peers stop waiting on this rank (PhaseSync::leave), and the
  // other nodes' (its Gloo groups' abort).
  void abort() override {
    if (sync_) sync_->leave();
    if (cross_) cross_->abort();
    if (fallback_) fallback_->abort();
  }

 private:
  shm::Segment& segment() const { return *state_->segment; }
  bool single_node() const { return state_ && config_.nodes == 1; }
  const Descriptor& published(int k) const { return segment().control(k).descriptor[parity_ & 1]; }
  // Whether every rank published its buffer (`where`: output or input) as in the segment.
  bool all_in_segment(std::int64_t Descriptor::*where = &Descriptor::offset) const;

  template <class Body>
  void guarded(Body&& body) {
    if (!broken_.empty())
      throw Error("shm: this group is unusable after an earlier failure: " + broken_);
    deadline_ = Clock::now() + timeout_;
    try {
      body();
    } catch (const std::exception& e) {
      // Ranks may now be in different phases: no later collective can be trusted.
      broken_ = e.what();
      throw;
    }
  }

  // What this rank says about a collective: what, of what, how, and its DDP_SHM_ALGO.
  Descriptor descriptor(Kind kind, DType dtype, std::size_t bytes, std::int32_t root,
                        std::int32_t op, Algorithm a, bool timing) const;

  // The first phase of a collective: publish what this rank is doing, wait
  // for every rank, and check they all do the same the same way.
  void begin(const Descriptor& mine);

  // ---- Which variant a call runs ------------------------------------------------------------

  // The variant for this call, decided before its first phase (so every rank
  // asks at the same point of the same call): forced, or this node's choice
  // for the call's size class, timed first when there is none yet (once the
  // timing budget is spent: the nearest timed class's choice). Tables
  // start equal on every rank (what the run's earlier groups timed, agreed
  // through the segment, then local rank 0's tune file over it) and change
  // only by choices every rank derives from the same timings, so all ranks
  // agree.
  Algorithm algorithm_for_call(Collective c, std::size_t bytes, DType dtype, std::int32_t op,
                               int root);

  // Why a class has its choice (what algorithm_for() says).
  enum class Source { kTimed, kFile, kEarlier, kNearest, kNoRoom };
  static const char* source_name(Source s);
  // Which of this process's learned choices (learned_choices.h) this group's may use.
  shm::ChoiceScope choice_scope() const;

  // Every local rank runs each candidate on scratch buffers in the segment
  // (zeros; the call's dtype, op, root and size, at most kLargestTimedBytes
  // in all): once to warm up, then `reps` times, keeping its fastest run.
  // The ranks publish those times and each picks, from the same table, the
  // candidate whose slowest rank was fastest. {chunked, false} without
  // timing when some rank has no room for scratch.
  std::pair<Algorithm, bool> choose_by_timing(Collective c, std::size_t bytes, DType dtype,
                                              std::int32_t op, int root);

  // One run of variant `a` of `c` on scratch at `p` (see choose_by_timing).
  void run_variant(Collective c, Algorithm a, char* p, std::size_t count, DType dtype,
                   std::int32_t op, int root);

  // Local rank 0: DDP_SHM_TUNE_FILE with this node's timed choices merged in
  // (a warning naming the file, once, when it cannot be written).
  void save_tune_file();

  // ---- The collectives' variants ------------------------------------------------------------

  void run_all_reduce(Algorithm a, void* data, std::size_t count, DType dtype, ReduceOp op,
                      const std::vector<ElementRange>* needed, bool timing);

  // pull: every rank but the root copies the root's buffer; push: the root
  // writes every other rank's buffer; chunked: through the root's slots.
  void run_broadcast(Algorithm a, void* data, std::size_t count, DType dtype, int root,
                     bool timing);

  // Broadcast through the root's double-buffered chunk slots; `first`, when
  // given, is published with the first chunk's phase.
  void chunked_broadcast(char* p, std::size_t bytes, int root, const Descriptor* first);

  // pull: each rank copies every rank's input (all in the segment) into its
  // own output, so a line crosses between cores once (read by its new owner);
  // push: each rank writes its input into every rank's output (all in the
  // segment), a line moving twice (taken over to write, read back by its
  // owner); chunked: through every rank's slots.
  void run_all_gather(Algorithm a, const void* in, void* out, std::size_t count, DType dtype,
                      bool timing);

  // pull (every rank's `in` in the segment): each rank reduces its block
  // straight from the others' inputs; chunked: chunk by chunk through the
  // slots, each rank copying in only the blocks the others reduce.
  void run_reduce_scatter(Algorithm a, const void* in, void* out, std::size_t count, DType dtype,
                          ReduceOp op, bool timing);

  // ---- Pages of this rank's arena -----------------------------------------------------------

  // Where this rank's arena is: in the segment (or the arena it carries,
  // mapped there), or on its own for a rank alone on its node (lone_).
  struct ArenaView {
    shm::ArenaPool& pool;
    int fd;                   // the file holding its pages
    std::size_t file_offset;  // where the arena starts in that file
    char* base;               // where the arena starts in this process
    std::size_t bytes;
  };
  ArenaView my_arena() const;

  // Takes `bytes` of this rank's arena and faults its pages in now, so a full
  // /dev/shm is ENOSPC here rather than SIGBUS later; `zeroed`: whatever an
  // earlier block left there is dropped first. The offset in the arena, or
  // nullopt with the reason in `why`.
  std::optional<std::size_t> take_pages(std::size_t bytes, std::string* why, bool zeroed = false);

  // Returns take_pages' block and its pages (scratch is not kept resident).
  void give_pages_back(std::size_t offset, std::size_t bytes);

  static std::size_t page_rounded(std::size_t bytes) {
    return (std::max<std::size_t>(bytes, 1) + 4095) / 4096 * 4096;
  }

  // out = first's value (`mine` when first is this rank) op every other
  // rank's `others(k)` in rank order, n elements. Each slice is reduced by
  // one rank only, always from its owner's value, so every rank ends with the
  // same bits. `out` may be `mine` or an `others(k)` only where that value is
  // read by the first step (elementwise, before it is written).
  template <class Others>
  void reduce_slice(char* out, const char* mine, Others&& others, std::size_t n, DType dtype,
                    ReduceOp op) {
    reduce_slice_from(me_, out, mine, others, n, dtype, op);
  }
  template <class Others>
  void reduce_slice_from(int first, char* out, const char* mine, Others&& others, std::size_t n,
                         DType dtype, ReduceOp op) {
    ReduceFn fn = reduce_function(dtype, op);
    const char* acc = mine;
    for (int k = 0; k < local_size_; ++k) {
      if (k == first) continue;
      fn(out, acc, others(k), n);
      acc = out;
    }
    // Across nodes: the same slice of every node, then the average over all ranks.
    if (cross_) cross_->all_reduce(out, n, dtype, op == ReduceOp::kAvg ? ReduceOp::kSum : op);
    if (op == ReduceOp::kAvg) divide_in_place(out, n, dtype, config_.size);
  }

  // Up to small_bytes: one copy into this rank's slot, one phase, and every
  // rank reduces all slots itself, in rank order (so all get the same bits).
  void small_all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op,
                        const Descriptor& d);

  // Every buffer lives in the segment: each rank reduces its slice of all
  // buffers and writes the result into every buffer at once, block by block
  // (the block stays in L1 between the reduction and the copies). No rank
  // reads or writes another's slice, so one phase at the end is all it takes:
  // nobody returns (and lets its caller touch the buffer) before every slice
  // of it has been written.
  // `pull` (DDP_SHM_ALGO=pull): each rank writes its reduced slice only into
  // its own buffer and, once every slice is reduced, copies the others' slices
  // from their owners' buffers; nobody returns (and lets its caller change its
  // buffer) before all have copied. Otherwise (push) it writes its slice into
  // every rank's buffer.
  void zero_copy_all_reduce(std::size_t count, DType dtype, ReduceOp op, bool pull);

  // all_reduce_partial in place: each rank reduces only the elements it needs
  // into its own buffer, reading the others' buffers, which nobody changes
  // before the final phase (the ranks' lists do not overlap, so nobody reads
  // an element another rank has already overwritten). Each element is reduced
  // in the order zero_copy_all_reduce uses (the value of the rank whose slice
  // holds it first, then the others by rank), so the bits are the same.
  void zero_copy_partial(std::size_t count, DType dtype, ReduceOp op,
                         const std::vector<ElementRange>& needed);

  // Private buffers, pipelined in chunks through double-buffered slots:
  // copy in what the others need, reduce this rank's slice into the result
  // slot, copy out the others' slices. `to` is the rank that receives the
  // result (reduce), or -1 for all (all_reduce). `first`, when given, is
  // published with the first chunk's phase.
  void chunked_reduce(char* data, std::size_t count, DType dtype, ReduceOp op, int to,
                      const Descriptor* first);

  // All-reduce of two ranks' private buffers, chunk by chunk: each rank
  // copies the peer's half of the chunk into its own slot; then, in one pass,
  // reduces its own half into its buffer and into the peer's slot (where the
  // peer copied that half from); then copies the peer's result for the other
  // half out of its own slot. Software-pipelined: the copy-in of chunk i+1 is
  // done before waiting for the peer's result of chunk i (its slot parity was
  // last used by chunk i-1, finished on both sides), so a rank waits only
  // when it is truly ahead.
  void two_rank_chunked_all_reduce(char* data, std::size_t count, DType dtype, ReduceOp op,
                                   ReduceIntoBothFn both);

  alignas(64) std::array<char, kFuseBytes> partial_block_{};  // zero_copy_partial's block

  // Local rank 0's creation failed: its reason, as it published it.
  [[noreturn]] void creation_failed(const std::string& published);

  // The segment local rank 0 published under `key` ("<identity> <name>",
  // see process_identity.h), once it has made it. If rank 0 dies first (and
  // shares this process's PID namespace, so its death can be seen), its
  // partly made segment is removed and the error names it; a creation that
  // failed is rank 0's reason.
  std::unique_ptr<shm::Segment> attach_published(const std::string& key,
                                                 Clock::time_point deadline);

  void open_segment();
  // ProcessGroupOptions::shm_carry_arena: this rank's arena is the process's
  // carried one (when its size fits the segment's), mapped in and published.
  void carry_arena();
  // The process's carried arena of `bytes` (a relaunch's is its
  // predecessor's), or nullptr when it has another size.
  std::shared_ptr<shm::CarriedArena> carried_arena(std::size_t bytes);

  // Hierarchical all-reduce needs the same number of ranks on every node.
  bool same_local_size_on_every_node();

  // Gloo over the whole group, created on first use (every rank reaches the
  // same collective, so every rank creates it there).
  Backend& fallback();
  // Gloo among the nodes when this node has one rank, else the whole group.
  Backend& across() { return cross_ ? *cross_ : fallback(); }

  BackendConfig config_;
  int me_, local_size_, first_rank_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds connect_;  // creation's waits for peers (connect_timeout)
  shm::Forced forced_;                 // DDP_SHM_ALGO
  std::string
      tune_path_;  // DDP_SHM_TUNE_FILE: local rank 0 reads it for every rank and saves new choices
  std::vector<shm::TuneEntry>
      tune_entries_;               // local rank 0: the file as read (every number of ranks)
  mutable std::mutex choices_mu_;  // the tables: algorithm_for() reads them from any thread
  shm::ChoiceTable choices_;  // every choice made (or read) so far, the same on every local rank
  std::map<std::pair<Collective, int>, Source> sources_;  // why each was made
  double budget_ms_;                                      // DDP_SHM_TUNE_BUDGET_MS
  double timing_spent_ms_ = 0;  // the slowest rank's timed runs so far (the same on every rank)
  bool tune_warned_ = false;
  std::shared_ptr<SharedState> state_;  // null when this rank is alone on its node
  // Alone on its node under shm_carry_arena: the carried arena allocate() takes from.
  std::shared_ptr<shm::LoneArena> lone_;
  std::unique_ptr<shm::PhaseSync> sync_;
  std::unique_ptr<Backend> cross_;     // Gloo among the ranks of this local rank on every node
  std::unique_ptr<Backend> fallback_;  // Gloo among all ranks
  Clock::time_point deadline_;
  std::uint64_t sequence_ = 0;  // collectives that published a descriptor
  unsigned parity_ = 0;         // of the current collective's descriptor
  unsigned small_parity_ = 0, chunk_parity_ = 0;
  std::string broken_;
  std::atomic<bool> warned_{false};  // allocate() may be called from any thread
};

}  // namespace ddp::shm_backend
