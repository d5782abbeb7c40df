// The shm backend: collectives among the ranks of one node through a shared
// segment (shm/segment.h) at memory speed; hierarchical all-reduce across
// nodes (Gloo between ranks of the same local rank); Gloo for everything else.
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
// Why one file of about 700 lines: the algorithms are members of one class
// that share its segment, phase counter and parities under the rule above;
// split apart, each would need that private state exposed.

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "backend.h"
#include "ddp/common/error.h"
#include "ddp/common/random_id.h"
#include "ddp/common/shm_names.h"
#include "ddp/log.h"
#include "process_identity.h"
#include "reduce_kernels.h"
#include "shm/arena.h"
#include "shm/segment.h"
#include "shm/sync.h"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;
using shm::Descriptor;

constexpr std::size_t kFuseBytes = 16 << 10;  // reduce-then-copy block of the private path

enum class Kind : std::uint32_t { kAllReduce = 1, kBroadcast, kReduce, kAllGather, kBarrier, kReduceScatter };

const char* kind_name(std::uint32_t kind) {
  switch (static_cast<Kind>(kind)) {
    case Kind::kAllReduce: return "all_reduce";
    case Kind::kBroadcast: return "broadcast";
    case Kind::kReduce: return "reduce";
    case Kind::kAllGather: return "all_gather";
    case Kind::kBarrier: return "barrier";
    case Kind::kReduceScatter: return "reduce_scatter";
  }
  return "an unknown collective";
}

std::string describe(const Descriptor& d) {
  std::string text = kind_name(d.kind);
  if (static_cast<Kind>(d.kind) == Kind::kBarrier) return text;
  text += " of " + std::to_string(d.bytes) + " bytes of " + dtype_name(static_cast<DType>(d.dtype));
  if (d.op >= 0) text += " (" + std::string(op_name(static_cast<ReduceOp>(d.op))) + ")";
  if (d.root >= 0) text += " from root " + std::to_string(d.root);
  return text;
}

// Elements [lo, hi) of part `k` when `count` are split into `parts`, every
// boundary on a cache line (no two ranks write one line).
struct Slice {
  std::size_t lo, hi;
  std::size_t size() const { return hi - lo; }
};
Slice slice_of(std::size_t count, int parts, int k, std::size_t element) {
  const std::size_t align = std::max<std::size_t>(1, shm::kCacheLine / element);
  const std::size_t per = ((count + parts - 1) / parts + align - 1) / align * align;
  const std::size_t lo = std::min(count, per * static_cast<std::size_t>(k));
  return {lo, std::min(count, lo + per)};
}

// How an all-reduce whose buffers all live in the segment runs (DDP_SHM_ALGO):
//   push     each rank reduces its slice and writes the result into every
//            rank's buffer (two ranks: one pass over both);
//   pull     each rank reduces its slice into its own buffer, then copies the
//            others' reduced slices from their buffers: every cache line is
//            written only by the rank that owns it;
//   chunked  as for private buffers, through the segment's chunk slots.
// auto is push. Which is fastest depends on the machine (how its cores share
// caches); every rank must use the same, which the first phase checks.
enum class InPlaceAlgorithm : std::uint32_t { kPush = 1, kPull = 2, kChunked = 3 };

const char* algorithm_name(std::uint32_t a) {
  switch (static_cast<InPlaceAlgorithm>(a)) {
    case InPlaceAlgorithm::kPush:
      return "push";
    case InPlaceAlgorithm::kPull:
      return "pull";
    case InPlaceAlgorithm::kChunked:
      return "chunked";
  }
  return "?";
}

InPlaceAlgorithm algorithm_from_env() {
  const char* text = std::getenv("DDP_SHM_ALGO");
  const std::string name = text == nullptr ? "" : text;
  if (name.empty() || name == "auto" || name == "push") return InPlaceAlgorithm::kPush;
  if (name == "pull") return InPlaceAlgorithm::kPull;
  if (name == "chunked") return InPlaceAlgorithm::kChunked;
  throw Error("environment variable DDP_SHM_ALGO='" + name + "' is not one of auto, push, pull, chunked");
}

// The segment, its allocator and this rank's place in it. Shared with the
// deleters of allocate()'s blocks, so the mapping outlives the backend while
// a block is still held.
struct SharedState {
  std::unique_ptr<shm::Segment> segment;
  std::mutex mu;
  std::unique_ptr<shm::ArenaAllocator> arena;  // this rank's arena
};

class ShmBackend final : public Backend {
 public:
  explicit ShmBackend(const BackendConfig& config)
      : config_(config), me_(config.local_rank), local_size_(config.local_size),
        first_rank_(config.rank - config.local_rank), timeout_(config.timeout), algorithm_(algorithm_from_env()) {
    if (!config.store) throw Error("process group: the shm backend needs a store");
    if (local_size_ < 1 || me_ < 0 || me_ >= local_size_ || local_size_ > config.size || first_rank_ < 0 ||
        first_rank_ + local_size_ > config.size) {
      throw Error("shm: local rank " + std::to_string(me_) + " of " + std::to_string(local_size_) +
                  " does not fit rank " + std::to_string(config.rank) + " of " + std::to_string(config.size));
    }
    if (config.nodes < 1 || config.node < 0 || config.node >= config.nodes ||
        (config.nodes == 1 && local_size_ != config.size)) {
      throw Error("shm: node " + std::to_string(config.node) + " of " + std::to_string(config.nodes) + " with " +
                  std::to_string(local_size_) + " local ranks does not fit a group of " +
                  std::to_string(config.size));
    }
    if (local_size_ > 1) open_segment();
    if (config.nodes > 1 && same_local_size_on_every_node()) {
      BackendConfig cross = config;
      cross.rank = config.node;
      cross.size = config.nodes;
      cross.store = make_prefix_store(config.store, "cross" + std::to_string(me_));
      cross_ = make_gloo_backend(cross);
    }
  }

  void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) override {
    all_reduce_impl(data, count, dtype, op, nullptr);
  }

  void all_reduce_partial(void* data, std::size_t count, DType dtype, ReduceOp op,
                          const std::vector<ElementRange>& needed) override {
    all_reduce_impl(data, count, dtype, op, &needed);
  }

  // `needed` (all_reduce_partial) only changes the in-place path on one node;
  // every other path reduces everything.
  void all_reduce_impl(void* data, std::size_t count, DType dtype, ReduceOp op, const std::vector<ElementRange>* needed) {
    guarded([&] {
      if (count == 0) return;
      if (!state_ || (config_.nodes > 1 && !cross_)) {
        // One rank on this node (across nodes: Gloo among them), or nodes of different sizes.
        return state_ ? fallback().all_reduce(data, count, dtype, op) : across().all_reduce(data, count, dtype, op);
      }
      const std::size_t bytes = count * dtype_size(dtype);
      Descriptor d{static_cast<std::uint32_t>(Kind::kAllReduce), static_cast<std::uint32_t>(dtype), bytes, -1, -1,
                   static_cast<std::int32_t>(op)};
      if (bytes <= segment().geometry().small_bytes && !cross_) return small_all_reduce(data, count, dtype, op, d);
      d.offset = segment().offset_of(data, bytes);
      d.algorithm = static_cast<std::uint32_t>(algorithm_);
      begin(d);
      const bool zero_copy = all_in_segment() && algorithm_ != InPlaceAlgorithm::kChunked;
      if (zero_copy && needed != nullptr && !cross_) return zero_copy_partial(count, dtype, op, *needed);
      if (zero_copy) return zero_copy_all_reduce(count, dtype, op, algorithm_ == InPlaceAlgorithm::kPull && !cross_);
      chunked_reduce(static_cast<char*>(data), count, dtype, op, -1, nullptr);
    });
  }

  void broadcast(void* data, std::size_t count, DType dtype, int root) override {
    guarded([&] {
      if (count == 0) return;
      if (!single_node()) return fallback().broadcast(data, count, dtype, root);
      const std::size_t bytes = count * dtype_size(dtype), chunk = segment().geometry().chunk_bytes;
      Descriptor d{static_cast<std::uint32_t>(Kind::kBroadcast), static_cast<std::uint32_t>(dtype), bytes, -1, root,
                   -1};
      auto* p = static_cast<char*>(data);
      for (std::size_t b = 0; b < bytes; b += chunk) {
        const std::size_t len = std::min(chunk, bytes - b);
        const unsigned parity = chunk_parity_++;
        char* slot = segment().chunk_slot(root, parity);
        if (me_ == root) std::memcpy(slot, p + b, len);
        b == 0 ? begin(d) : sync_->phase(deadline_);
        if (me_ != root) std::memcpy(p + b, slot, len);
      }
    });
  }

  void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) override {
    guarded([&] {
      if (count == 0) return;
      if (!single_node()) return fallback().reduce(data, count, dtype, op, root);
      Descriptor d{static_cast<std::uint32_t>(Kind::kReduce), static_cast<std::uint32_t>(dtype),
                   count * dtype_size(dtype), -1, root, static_cast<std::int32_t>(op)};
      chunked_reduce(static_cast<char*>(data), count, dtype, op, root, &d);
    });
  }

  void all_gather(const void* in, void* out, std::size_t count, DType dtype) override {
    guarded([&] {
      if (count == 0) return;
      if (!single_node()) return fallback().all_gather(in, out, count, dtype);
      const std::size_t bytes = count * dtype_size(dtype), chunk = segment().geometry().chunk_bytes;
      Descriptor d{static_cast<std::uint32_t>(Kind::kAllGather), static_cast<std::uint32_t>(dtype), bytes, -1, -1,
                   -1};
      d.offset = segment().offset_of(out, bytes * static_cast<std::size_t>(local_size_));
      d.input_offset = segment().offset_of(in, bytes);
      // The first phase comes before any copy: which path runs depends on
      // where every rank's output lives, known once all have published.
      begin(d);
      auto* src = static_cast<const char*>(in);
      const bool zero_copy = all_in_segment();
      if (zero_copy && all_in_segment(&Descriptor::input_offset)) {
        // Every input and output lives in the segment: each rank pulls the
        // others' inputs into its own output. A line then crosses between
        // cores once (read by its new owner), where pushing into another
        // rank's output moves it twice (taken over to write, read back by
        // its owner): ParamShards' in-place gather of the parameters.
        char* mine = segment().base() + published(me_).offset;
        for (int k = 0; k < local_size_; ++k) {
          char* to = mine + static_cast<std::size_t>(k) * bytes;
          const char* from = segment().base() + published(k).input_offset;
          if (to != from) std::memmove(to, from, bytes);
        }
        sync_->phase(deadline_);  // nobody returns (and lets its caller change its input) before all have read it
        return;
      }
      if (zero_copy) {
        // Every output lives in the segment: this rank writes its input
        // straight into every rank's output (in place when `in` is already
        // its own slot there); the phase lets nobody read before all wrote.
        for (int k = 0; k < local_size_; ++k) {
          char* to = segment().base() + published(k).offset + static_cast<std::size_t>(me_) * bytes;
          if (to != src) std::memmove(to, src, bytes);
        }
        sync_->phase(deadline_);
        return;
      }
      auto* dst = static_cast<char*>(out);
      for (std::size_t b = 0; b < bytes; b += chunk) {
        const std::size_t len = std::min(chunk, bytes - b);
        const unsigned parity = chunk_parity_++;
        std::memcpy(segment().chunk_slot(me_, parity), src + b, len);
        sync_->phase(deadline_);
        for (int k = 0; k < local_size_; ++k) {
          char* to = dst + static_cast<std::size_t>(k) * bytes + b;
          const char* from = k == me_ ? src + b : segment().chunk_slot(k, parity);
          if (to != from) std::memmove(to, from, len);
        }
      }
    });
  }

  void barrier() override {
    guarded([&] {
      if (!single_node()) return fallback().barrier();
      begin(Descriptor{static_cast<std::uint32_t>(Kind::kBarrier), 0, 0, -1, -1, -1});
    });
  }

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
  // Rank r's `out` = block r of every rank's `in`, reduced. In place when
  // every rank's `in` lives in the segment (each rank reads its block straight
  // from the others' inputs); otherwise chunk by chunk through the slots, each
  // rank copying in only the blocks the others reduce. Across nodes: Gloo.
  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op) override {
    guarded([&] {
      if (count == 0) return;
      if (!single_node()) return fallback().reduce_scatter(in, out, count, dtype, op);
      const std::size_t element = dtype_size(dtype), bytes = count * element;
      Descriptor d{static_cast<std::uint32_t>(Kind::kReduceScatter), static_cast<std::uint32_t>(dtype), bytes, -1, -1,
                   static_cast<std::int32_t>(op)};
      d.offset = segment().offset_of(in, bytes * static_cast<std::size_t>(local_size_));
      // Which path runs depends on where every rank's input lives, known once all have published.
      begin(d);
      auto* src = static_cast<const char*>(in);
      auto* dst = static_cast<char*>(out);
      const std::size_t mine = static_cast<std::size_t>(me_) * bytes;
      if (all_in_segment()) {
        const std::size_t block = std::max<std::size_t>(1, kFuseBytes / element);
        for (std::size_t o = 0; o < count; o += block) {
          const std::size_t n = std::min(block, count - o), at = mine + o * element;
          reduce_slice(dst + o * element, src + at,
                       [&](int k) { return segment().base() + published(k).offset + at; }, n, dtype, op);
        }
        sync_->phase(deadline_);  // nobody returns (and lets its caller reuse `in`) before all have read it
        return;
      }
      // Each chunk slot holds, per destination rank, `per` elements of its block.
      const std::size_t per =
          std::max<std::size_t>(1, segment().geometry().chunk_bytes / (element * static_cast<std::size_t>(local_size_)));
      for (std::size_t b = 0; b < count; b += per) {
        const std::size_t m = std::min(per, count - b);
        const unsigned parity = chunk_parity_++;
        char* slot = segment().chunk_slot(me_, parity);
        for (int k = 0; k < local_size_; ++k) {
          if (k == me_) continue;
          std::memcpy(slot + static_cast<std::size_t>(k) * per * element,
                      src + (static_cast<std::size_t>(k) * count + b) * element, m * element);
        }
        sync_->phase(deadline_);
        const std::size_t at = static_cast<std::size_t>(me_) * per * element;
        reduce_slice(dst + b * element, src + mine + b * element,
                     [&](int k) { return segment().chunk_slot(k, parity) + at; }, m, dtype, op);
      }
    });
  }

  // A block of local rank 0's arena, never given back (other ranks may still
  // use it when rank 0 drops its reference): it goes with the segment.
  std::int64_t offer_node_shared(std::size_t bytes) override {
    if (!state_ || config_.nodes > 1 || local_size_ < 2 || me_ != 0) return -1;
    std::lock_guard<std::mutex> lock(state_->mu);
    auto offset = state_->arena->take(bytes);
    if (!offset) return -1;
    const std::size_t at = segment().arena_offset(me_) + *offset;
    const std::size_t len = (std::max<std::size_t>(bytes, 1) + 4095) / 4096 * 4096;
    if (posix_fallocate(segment().fd(), static_cast<off_t>(at), static_cast<off_t>(len)) != 0) {
      state_->arena->give_back(*offset);
      return -1;
    }
    std::memset(segment().base() + at, 0, len);  // pages now, and zeros even where the arena was used before
    return static_cast<std::int64_t>(at);
  }

  std::shared_ptr<void> node_shared_at(std::int64_t offset, std::size_t bytes) override {
    if (!state_ || offset < 0 || segment().offset_of(segment().base() + offset, bytes) != offset) return nullptr;
    std::shared_ptr<SharedState> keep = state_;  // the mapping lives as long as a reference does
    return std::shared_ptr<void>(segment().base() + offset, [keep](void*) {});
  }

  std::shared_ptr<void> allocate(std::size_t bytes) override {
    if (!state_) return Backend::allocate(bytes);
    std::string why;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (auto offset = state_->arena->take(bytes)) {
        const std::size_t at = segment().arena_offset(me_) + *offset;
        const std::size_t len = (std::max<std::size_t>(bytes, 1) + 4095) / 4096 * 4096;
        // Pages now, so a full /dev/shm is ENOSPC here rather than SIGBUS later.
        int rc = posix_fallocate(segment().fd(), static_cast<off_t>(at), static_cast<off_t>(len));
        if (rc == 0) {
          char* p = segment().base() + at;
#ifdef MADV_POPULATE_WRITE
          if (madvise(p, len, MADV_POPULATE_WRITE) != 0) std::memset(p, 0, len);
#else
          std::memset(p, 0, len);
#endif
          std::shared_ptr<SharedState> keep = state_;
          std::size_t off = *offset;
          return std::shared_ptr<void>(p, [keep, off](void*) {
            std::lock_guard<std::mutex> held(keep->mu);
            keep->arena->give_back(off);
          });
        }
        state_->arena->give_back(*offset);
        why = "/dev/shm has no room: " + std::string(std::strerror(rc));
      } else {
        why = "this rank's " + std::to_string(segment().geometry().arena_bytes >> 20) +
              " MiB arena is used up (DDP_SHM_ARENA_MB)";
      }
    }
    if (!warned_.exchange(true)) {
      log::write(log::Level::kWarn, true,
                 "shm: allocate(" + std::to_string(bytes) + " bytes) returns private memory because " + why +
                     "; collectives on it copy through shared memory instead of running in place");
    }
    return Backend::allocate(bytes);
  }

 private:
  shm::Segment& segment() const { return *state_->segment; }
  bool single_node() const { return state_ && config_.nodes == 1; }
  const Descriptor& published(int k) const { return segment().control(k).descriptor[parity_ & 1]; }
  // Whether every rank published its buffer (`where`: output or input) as in the segment.
  bool all_in_segment(std::int64_t Descriptor::*where = &Descriptor::offset) const {
    for (int k = 0; k < local_size_; ++k) {
      if (published(k).*where < 0) return false;
    }
    return true;
  }

  template <class Body>
  void guarded(Body&& body) {
    if (!broken_.empty()) throw Error("shm: this group is unusable after an earlier failure: " + broken_);
    deadline_ = Clock::now() + timeout_;
    try {
      body();
    } catch (const std::exception& e) {
      // Ranks may now be in different phases: no later collective can be trusted.
      broken_ = e.what();
      throw;
    }
  }

  // The first phase of a collective: publish what this rank is doing, wait
  // for every rank, and check they all do the same.
  void begin(const Descriptor& mine) {
    parity_ = sequence_++ & 1;
    segment().control(me_).descriptor[parity_] = mine;  // published by the phase's release
    sync_->phase(deadline_);
    for (int k = 0; k < local_size_; ++k) {
      const Descriptor& d = published(k);
      if (d.kind != mine.kind || d.dtype != mine.dtype || d.bytes != mine.bytes || d.root != mine.root ||
          d.op != mine.op) {
        throw Error("collective mismatch among the ranks of this node: rank " + std::to_string(first_rank_ + me_) +
                    " is in " + describe(mine) + ", rank " + std::to_string(first_rank_ + k) + " in " + describe(d));
      }
      if (d.algorithm != mine.algorithm) {
        throw Error("shm: the ranks of this node run different in-place all-reduce algorithms (DDP_SHM_ALGO): rank " +
                    std::to_string(first_rank_ + me_) + " " + algorithm_name(mine.algorithm) + ", rank " +
                    std::to_string(first_rank_ + k) + " " + algorithm_name(d.algorithm));
      }
    }
  }

  // out = first's value (`mine` when first is this rank) op every other
  // rank's `others(k)` in rank order, n elements. Each slice is reduced by
  // one rank only, always from its owner's value, so every rank ends with the
  // same bits. `out` may be `mine` or an `others(k)` only where that value is
  // read by the first step (elementwise, before it is written).
  template <class Others>
  void reduce_slice(char* out, const char* mine, Others&& others, std::size_t n, DType dtype, ReduceOp op) {
    reduce_slice_from(me_, out, mine, others, n, dtype, op);
  }
  template <class Others>
  void reduce_slice_from(int first, char* out, const char* mine, Others&& others, std::size_t n, DType dtype,
                         ReduceOp op) {
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
  void small_all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op, const Descriptor& d) {
    const unsigned parity = small_parity_++;
    std::memcpy(segment().small_slot(me_, parity), data, d.bytes);
    begin(d);
    ReduceFn fn = reduce_function(dtype, op);
    fn(data, segment().small_slot(0, parity), segment().small_slot(1, parity), count);
    for (int k = 2; k < local_size_; ++k) fn(data, data, segment().small_slot(k, parity), count);
    if (op == ReduceOp::kAvg) divide_in_place(data, count, dtype, config_.size);
  }

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
  void zero_copy_all_reduce(std::size_t count, DType dtype, ReduceOp op, bool pull) {
    const std::size_t element = dtype_size(dtype);
    char* base = segment().base();
    auto buffer = [&](int k) { return base + published(k).offset; };
    const Slice mine = slice_of(count, local_size_, me_, element);
    ReduceIntoBothFn both = local_size_ == 2 && !cross_ && !pull ? reduce_into_both_function(dtype, op) : nullptr;
    if (both != nullptr && mine.size() > 0) {
      // Two ranks: one pass reads both slices and writes the result to both.
      const std::size_t at = mine.lo * element;
      both(buffer(me_) + at, buffer(1 - me_) + at, mine.size(), op == ReduceOp::kAvg ? config_.size : 1);
      sync_->phase(deadline_);
      return;
    }
    const std::size_t block = cross_ ? mine.size() : std::max<std::size_t>(1, kFuseBytes / element);
    for (std::size_t o = mine.lo; o < mine.hi; o += block) {
      const std::size_t n = std::min(block, mine.hi - o), at = o * element;
      reduce_slice(buffer(me_) + at, buffer(me_) + at, [&](int k) { return buffer(k) + at; }, n, dtype, op);
      for (int k = 0; k < local_size_ && !pull; ++k) {
        if (k != me_) std::memcpy(buffer(k) + at, buffer(me_) + at, n * element);
      }
    }
    sync_->phase(deadline_);
    if (!pull) return;
    for (int k = 0; k < local_size_; ++k) {
      if (k == me_) continue;
      const Slice theirs = slice_of(count, local_size_, k, element);
      std::memcpy(buffer(me_) + theirs.lo * element, buffer(k) + theirs.lo * element, theirs.size() * element);
    }
    sync_->phase(deadline_);
  }

  // all_reduce_partial in place: each rank reduces only the elements it needs
  // into its own buffer, reading the others' buffers, which nobody changes
  // before the final phase (the ranks' lists do not overlap, so nobody reads
  // an element another rank has already overwritten). Each element is reduced
  // in the order zero_copy_all_reduce uses (the value of the rank whose slice
  // holds it first, then the others by rank), so the bits are the same.
  void zero_copy_partial(std::size_t count, DType dtype, ReduceOp op, const std::vector<ElementRange>& needed) {
    const std::size_t element = dtype_size(dtype);
    const std::size_t block = std::max<std::size_t>(1, kFuseBytes / element);
    char* base = segment().base();
    auto buffer = [&](int k) { return base + published(k).offset; };
    for (const ElementRange& range : needed) {
      for (int owner = 0; owner < local_size_; ++owner) {
        const Slice slice = slice_of(count, local_size_, owner, element);
        const std::size_t lo = std::max(range.begin, slice.lo), hi = std::min(range.end, slice.hi);
        for (std::size_t o = lo; o < hi; o += block) {
          const std::size_t n = std::min(block, hi - o), at = o * element;
          // Into this rank's buffer directly when its own value is read by
          // the first step (it is the owner, or the first rank after it; two
          // ranks: always); otherwise through an L1 block, so its value is
          // not overwritten before its turn in the order.
          const int first_other = owner == 0 ? 1 : 0;
          char* out = owner == me_ || first_other == me_ ? buffer(me_) + at : partial_block_.data();
          reduce_slice_from(owner, out, buffer(owner) + at, [&](int k) { return buffer(k) + at; }, n, dtype, op);
          if (out != buffer(me_) + at) std::memcpy(buffer(me_) + at, out, n * element);
        }
      }
    }
    sync_->phase(deadline_);
  }

  // Private buffers, pipelined in chunks through double-buffered slots:
  // copy in what the others need, reduce this rank's slice into the result
  // slot, copy out the others' slices. `to` is the rank that receives the
  // result (reduce), or -1 for all (all_reduce). `first`, when given, is
  // published with the first chunk's phase.
  void chunked_reduce(char* data, std::size_t count, DType dtype, ReduceOp op, int to, const Descriptor* first) {
    if (to < 0 && first == nullptr && local_size_ == 2 && !cross_) {
      if (ReduceIntoBothFn both = reduce_into_both_function(dtype, op); both != nullptr) {
        return two_rank_chunked_all_reduce(data, count, dtype, op, both);
      }
    }
    const std::size_t element = dtype_size(dtype);
    const std::size_t per_chunk = segment().geometry().chunk_bytes / element;
    const bool receive = to < 0 || to == me_;
    for (std::size_t b = 0; b < count; b += per_chunk) {
      const std::size_t m = std::min(per_chunk, count - b);
      const unsigned parity = chunk_parity_++;
      char* src = data + b * element;
      char* slot = segment().chunk_slot(me_, parity);
      char* result = segment().result_slot(parity);
      const Slice mine = slice_of(m, local_size_, me_, element);
      std::memcpy(slot, src, mine.lo * element);
      std::memcpy(slot + mine.hi * element, src + mine.hi * element, (m - mine.hi) * element);
      if (first != nullptr) {
        begin(*first);
        first = nullptr;
      } else {
        sync_->phase(deadline_);
      }
      if (mine.size() > 0) {
        // In blocks that stay in L1 between the reduction and the copy back
        // (within a node; across nodes the slice goes to Gloo whole).
        const std::size_t block = cross_ ? mine.size() : std::max<std::size_t>(1, kFuseBytes / element);
        for (std::size_t o = mine.lo; o < mine.hi; o += block) {
          const std::size_t n = std::min(block, mine.hi - o), at = o * element;
          reduce_slice(result + at, src + at, [&](int k) { return segment().chunk_slot(k, parity) + at; }, n, dtype,
                       op);
          if (receive) std::memcpy(src + at, result + at, n * element);
        }
      }
      sync_->phase(deadline_);
      if (!receive) continue;
      for (int k = 0; k < local_size_; ++k) {
        if (k == me_) continue;
        const Slice s = slice_of(m, local_size_, k, element);
        std::memcpy(src + s.lo * element, result + s.lo * element, s.size() * element);
      }
    }
  }

  // All-reduce of two ranks' private buffers, chunk by chunk: each rank
  // copies the peer's half of the chunk into its own slot; then, in one pass,
  // reduces its own half into its buffer and into the peer's slot (where the
  // peer copied that half from); then copies the peer's result for the other
  // half out of its own slot. Software-pipelined: the copy-in of chunk i+1 is
  // done before waiting for the peer's result of chunk i (its slot parity was
  // last used by chunk i-1, finished on both sides), so a rank waits only
  // when it is truly ahead.
  void two_rank_chunked_all_reduce(char* data, std::size_t count, DType dtype, ReduceOp op, ReduceIntoBothFn both) {
    const std::size_t element = dtype_size(dtype);
    const std::size_t per_chunk = segment().geometry().chunk_bytes / element;
    const std::size_t chunks = (count + per_chunk - 1) / per_chunk;
    const int divisor = op == ReduceOp::kAvg ? config_.size : 1;
    auto length = [&](std::size_t i) { return std::min(per_chunk, count - i * per_chunk); };
    auto copy_in = [&](std::size_t i, unsigned parity) {
      const Slice theirs = slice_of(length(i), 2, 1 - me_, element);
      std::memcpy(segment().chunk_slot(me_, parity) + theirs.lo * element, data + (i * per_chunk + theirs.lo) * element,
                  theirs.size() * element);
      return sync_->arrive();
    };
    unsigned parity = chunk_parity_++;
    std::uint32_t copied = copy_in(0, parity);
    for (std::size_t i = 0; i < chunks; ++i) {
      char* chunk = data + i * per_chunk * element;
      const Slice mine = slice_of(length(i), 2, me_, element), theirs = slice_of(length(i), 2, 1 - me_, element);
      sync_->wait_all(copied, deadline_);  // the peer's copy of this rank's half is in the peer's slot
      both(chunk + mine.lo * element, segment().chunk_slot(1 - me_, parity) + mine.lo * element, mine.size(), divisor);
      const std::uint32_t reduced = sync_->arrive();
      const unsigned next = i + 1 < chunks ? chunk_parity_++ : parity;
      if (i + 1 < chunks) copied = copy_in(i + 1, next);
      sync_->wait_all(reduced, deadline_);  // the peer's result for the other half is in this rank's slot
      std::memcpy(chunk + theirs.lo * element, segment().chunk_slot(me_, parity) + theirs.lo * element,
                  theirs.size() * element);
      parity = next;
    }
  }

  alignas(64) std::array<char, kFuseBytes> partial_block_{};  // zero_copy_partial's block

  // Local rank 0's creation failed: its reason, as it published it.
  [[noreturn]] void creation_failed(const std::string& published) {
    throw Error("shm: rank " + std::to_string(first_rank_) + " (local rank 0) could not create this node's segment: " +
                published.substr(1));
  }

  // The segment local rank 0 published under `key` ("<identity> <name>",
  // see process_identity.h), once it has made it. If rank 0 dies first (and
  // shares this process's PID namespace, so its death can be seen), its
  // partly made segment is removed and the error names it; a creation that
  // failed is rank 0's reason.
  std::unique_ptr<shm::Segment> attach_published(const std::string& key, Clock::time_point deadline) {
    std::string published = config_.store->get(key, timeout_);
    if (!published.empty() && published[0] == '!') creation_failed(published);
    const auto space = published.rfind(' ');
    if (space == std::string::npos || space == 0) {
      throw Error("shm: malformed segment announcement '" + published + "' under " + key);
    }
    const std::string name = published.substr(space + 1);
    const std::string creator = published.substr(0, space);
    const pid_t creator_pid = static_cast<pid_t>(std::atol(creator.c_str() + creator.rfind(' ') + 1));
    const std::string here = detail::pid_namespace_of(detail::process_identity());
    const bool can_see_creator = !here.empty() && detail::pid_namespace_of(creator) == here && creator_pid > 0;
    auto next_look = Clock::now() + std::chrono::milliseconds(100);
    for (;;) {
      if (auto segment = shm::Segment::try_attach(name, me_, local_size_)) return segment;
      if (can_see_creator && shm::proc_says_dead(creator_pid)) {
        shm_unlink(name.c_str());  // ENOENT when it died before creating it
        throw Error("shm: local rank 0 (rank " + std::to_string(first_rank_) + ", pid " +
                    std::to_string(creator_pid) + ") exited before it had made segment " + name + "; removed it");
      }
      if (Clock::now() >= deadline) {
        throw Error("shm: local rank 0 (rank " + std::to_string(first_rank_) + ") did not make segment " + name +
                    " within the timeout");
      }
      if (Clock::now() >= next_look) {  // a creation that failed replaces the announcement
        published = config_.store->get(key, timeout_);
        if (!published.empty() && published[0] == '!') creation_failed(published);
        next_look = Clock::now() + std::chrono::milliseconds(100);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  void open_segment() {
    const std::string key = "shm/node" + std::to_string(config_.node);
    const auto deadline = Clock::now() + timeout_;
    state_ = std::make_shared<SharedState>();
    if (me_ == 0) {
      const std::string run = config_.run_id.empty() ? "anon" + std::to_string(getpid()) : config_.run_id;
      const std::string name = shm_segment_name(run, config_.round, config_.group_name, config_.node, random_hex(8));
      // Published before it exists, with this process's identity: if this
      // rank dies while making it, the others know what to remove.
      config_.store->set(key, detail::process_identity() + " " + name);
      try {
        state_->segment = shm::Segment::create(name, shm::Geometry::from_env(local_size_), me_);
      } catch (const std::exception& e) {
        config_.store->set(key, "!" + std::string(e.what()));  // peers fail with the reason, not a timeout
        throw;
      }
      state_->segment->mark_attached();
      state_->segment->wait_attached_and_unlink(deadline);
    } else {
      state_->segment = attach_published(key, deadline);
      state_->segment->mark_attached();
      // Peers' pids are known once all attached (they are watched for death).
      state_->segment->wait_attached_and_unlink(deadline);
    }
    state_->arena = std::make_unique<shm::ArenaAllocator>(segment().geometry().arena_bytes);
    std::vector<shm::Peer> peers;
    for (int k = 0; k < local_size_; ++k) {
      peers.push_back({&segment().control(k).word, static_cast<pid_t>(segment().control(k).pid), first_rank_ + k});
    }
    sync_ = std::make_unique<shm::PhaseSync>(std::move(peers), me_, shm::WaitPolicy::for_ranks(local_size_));
  }

  // Hierarchical all-reduce needs the same number of ranks on every node.
  bool same_local_size_on_every_node() {
    const std::string prefix = "shm/local_size/node";
    if (me_ == 0) config_.store->set(prefix + std::to_string(config_.node), std::to_string(local_size_));
    for (int n = 0; n < config_.nodes; ++n) {
      if (config_.store->get(prefix + std::to_string(n), timeout_) != std::to_string(local_size_)) return false;
    }
    return true;
  }

  // Gloo over the whole group, created on first use (every rank reaches the
  // same collective, so every rank creates it there).
  Backend& fallback() {
    if (!fallback_) {
      BackendConfig all = config_;
      all.store = make_prefix_store(config_.store, "gloo");
      fallback_ = make_gloo_backend(all);
    }
    return *fallback_;
  }
  // Gloo among the nodes when this node has one rank, else the whole group.
  Backend& across() { return cross_ ? *cross_ : fallback(); }

  BackendConfig config_;
  int me_, local_size_, first_rank_;
  std::chrono::milliseconds timeout_;
  InPlaceAlgorithm algorithm_;  // DDP_SHM_ALGO
  std::shared_ptr<SharedState> state_;  // null when this rank is alone on its node
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

}  // namespace

std::unique_ptr<Backend> make_shm_backend(const BackendConfig& config) { return std::make_unique<ShmBackend>(config); }

}  // namespace ddp
