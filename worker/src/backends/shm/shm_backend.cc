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
// all_reduce, reduce_scatter, all_gather and broadcast have named variants
// (shm/algorithms.h): forced by DDP_SHM_ALGO, or timed by every local rank
// at the first call of each size class and agreed from one table
// (algorithm_for_call, choose_by_timing), optionally kept in DDP_SHM_TUNE_FILE.
//
// Why one file of about 1000 lines: the variants are members of one class
// that share its segment, phase counter and parities under the rule above,
// and the timing runs them; split apart, each would need that private state
// exposed.

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

#include "core/backend.h"
#include "ddp/common/error.h"
#include "ddp/common/random_id.h"
#include "ddp/common/shm_names.h"
#include "ddp/log.h"
#include "core/process_identity.h"
#include "kernels/reduce_kernels.h"
#include "backends/shm/arena.h"
#include "backends/shm/segment.h"
#include "backends/shm/sync.h"
#include "backends/shm/tune_file.h"

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
  if (d.timing != 0) text += " (while timing its algorithms)";
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

using shm::Algorithm;
using shm::Collective;

// What DDP_SHM_ALGO (or the group's shm_algorithm option, which wins) forces.
shm::Forced forced_from(const std::string& option) {
  if (!option.empty()) return shm::parse_forced(option, "process group option shm_algorithm");
  const char* text = std::getenv("DDP_SHM_ALGO");
  return shm::parse_forced(text == nullptr ? "" : text, "environment variable DDP_SHM_ALGO");
}

// DDP_SHM_TUNE_BUDGET_MS, in milliseconds.
double budget_from_env() {
  const char* text = std::getenv("DDP_SHM_TUNE_BUDGET_MS");
  return shm::parse_timing_budget(text == nullptr ? "" : text);
}

Kind kind_of(Collective c) {
  switch (c) {
    case Collective::kAllReduce: return Kind::kAllReduce;
    case Collective::kReduceScatter: return Kind::kReduceScatter;
    case Collective::kAllGather: return Kind::kAllGather;
    case Collective::kBroadcast: return Kind::kBroadcast;
  }
  return Kind::kBarrier;
}

// Where a variant that reads or writes other ranks' buffers can run: `pull`
// needs the buffers it reads in the segment, `push` those it writes; a
// variant that cannot run falls to the other in-place one, then to chunked.
Algorithm runnable(Algorithm wanted, bool can_pull, bool can_push) {
  if (wanted == Algorithm::kPull) return can_pull ? wanted : can_push ? Algorithm::kPush : Algorithm::kChunked;
  if (wanted == Algorithm::kPush) return can_push ? wanted : can_pull ? Algorithm::kPull : Algorithm::kChunked;
  return Algorithm::kChunked;
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
        first_rank_(config.rank - config.local_rank), timeout_(config.timeout),
        forced_(forced_from(config.shm_algorithm)),
        budget_ms_(budget_from_env()) {
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
      const Algorithm a = algorithm_for_call(Collective::kAllReduce, count * dtype_size(dtype), dtype,
                                             static_cast<std::int32_t>(op), -1);
      run_all_reduce(a, data, count, dtype, op, needed, false);
    });
  }

  void broadcast(void* data, std::size_t count, DType dtype, int root) override {
    guarded([&] {
      if (count == 0) return;
      if (!single_node()) return fallback().broadcast(data, count, dtype, root);
      const Algorithm a = algorithm_for_call(Collective::kBroadcast, count * dtype_size(dtype), dtype, -1, root);
      run_broadcast(a, data, count, dtype, root, false);
    });
  }

  void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) override {
    guarded([&] {
      if (count == 0) return;
      if (!single_node()) return fallback().reduce(data, count, dtype, op, root);
      const Descriptor d = descriptor(Kind::kReduce, dtype, count * dtype_size(dtype), root,
                                      static_cast<std::int32_t>(op), Algorithm::kChunked, false);
      chunked_reduce(static_cast<char*>(data), count, dtype, op, root, &d);
    });
  }

  void all_gather(const void* in, void* out, std::size_t count, DType dtype) override {
    guarded([&] {
      if (count == 0) return;
      if (!single_node()) return fallback().all_gather(in, out, count, dtype);
      const Algorithm a = algorithm_for_call(Collective::kAllGather, count * dtype_size(dtype), dtype, -1, -1);
      run_all_gather(a, in, out, count, dtype, false);
    });
  }

  void barrier() override {
    guarded([&] {
      if (!single_node()) return fallback().barrier();
      begin(descriptor(Kind::kBarrier, DType::kUInt8, 0, -1, -1, Algorithm::kAuto, false));
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
  // Rank r's `out` = block r of every rank's `in`, reduced. Across nodes: Gloo.
  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op) override {
    guarded([&] {
      if (count == 0) return;
      if (!single_node()) return fallback().reduce_scatter(in, out, count, dtype, op);
      const Algorithm a = algorithm_for_call(Collective::kReduceScatter, count * dtype_size(dtype), dtype,
                                             static_cast<std::int32_t>(op), -1);
      run_reduce_scatter(a, in, out, count, dtype, op, false);
    });
  }

  // A block of local rank 0's arena, never given back (other ranks may still
  // use it when rank 0 drops its reference): it goes with the segment.
  std::int64_t offer_node_shared(std::size_t bytes) override {
    if (!state_ || config_.nodes > 1 || local_size_ < 2 || me_ != 0) return -1;
    std::string why;
    const auto offset = take_pages(bytes, &why, true);  // zeros even where the arena was used before
    return offset ? static_cast<std::int64_t>(segment().arena_offset(me_) + *offset) : -1;
  }

  std::shared_ptr<void> node_shared_at(std::int64_t offset, std::size_t bytes) override {
    if (!state_ || offset < 0 || segment().offset_of(segment().base() + offset, bytes) != offset) return nullptr;
    std::shared_ptr<SharedState> keep = state_;  // the mapping lives as long as a reference does
    return std::shared_ptr<void>(segment().base() + offset, [keep](void*) {});
  }

  std::shared_ptr<void> allocate(std::size_t bytes) override {
    if (!state_) return Backend::allocate(bytes);
    std::string why;
    if (auto offset = take_pages(bytes, &why)) {
      std::shared_ptr<SharedState> keep = state_;
      const std::size_t off = *offset;
      return std::shared_ptr<void>(segment().base() + segment().arena_offset(me_) + off, [keep, off](void*) {
        std::lock_guard<std::mutex> held(keep->mu);
        keep->arena->give_back(off);
      });
    }
    if (!warned_.exchange(true)) {
      log::write(log::Level::kWarn, true,
                 "shm: allocate(" + std::to_string(bytes) + " bytes) returns private memory because " + why +
                     "; collectives on it copy through shared memory instead of running in place");
    }
    return Backend::allocate(bytes);
  }

  std::string algorithm_for(const std::string& collective, std::size_t bytes) const override {
    const auto c = shm::collective_named(collective);
    if (!c || !single_node()) return "";
    if (forced_.of(*c) != Algorithm::kAuto) return std::string(shm::algorithm_name(forced_.of(*c))) + " (forced)";
    std::lock_guard<std::mutex> lock(choices_mu_);
    const auto key = std::make_pair(*c, shm::size_class(bytes));
    const auto it = choices_.find(key);
    if (it == choices_.end()) return "";
    return std::string(shm::algorithm_name(it->second)) + " (" + source_name(sources_.at(key)) + ")";
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

  // What this rank says about a collective: what, of what, how, and its DDP_SHM_ALGO.
  Descriptor descriptor(Kind kind, DType dtype, std::size_t bytes, std::int32_t root, std::int32_t op, Algorithm a,
                        bool timing) const {
    Descriptor d{static_cast<std::uint32_t>(kind), static_cast<std::uint32_t>(dtype), bytes, -1, root, op};
    d.algorithm = static_cast<std::uint16_t>(a);
    d.timing = timing ? 1 : 0;
    d.forced = forced_.packed();
    d.budget_us = static_cast<std::uint32_t>(std::min(budget_ms_ * 1e3, 4e9));
    return d;
  }

  // The first phase of a collective: publish what this rank is doing, wait
  // for every rank, and check they all do the same the same way.
  void begin(const Descriptor& mine) {
    parity_ = sequence_++ & 1;
    segment().control(me_).descriptor[parity_] = mine;  // published by the phase's release
    sync_->phase(deadline_);
    for (int k = 0; k < local_size_; ++k) {
      const Descriptor& d = published(k);
      const std::string ranks_of = "rank " + std::to_string(first_rank_ + me_) + " ";
      const std::string rank_k = ", rank " + std::to_string(first_rank_ + k) + " ";
      if (d.forced != mine.forced) {
        throw Error("shm: the ranks of this node force different algorithms (DDP_SHM_ALGO): " + ranks_of +
                    shm::Forced::unpacked(mine.forced).describe() + rank_k +
                    shm::Forced::unpacked(d.forced).describe());
      }
      if (d.budget_us != mine.budget_us) {
        throw Error("shm: the ranks of this node have different timing budgets (DDP_SHM_TUNE_BUDGET_MS): " + ranks_of +
                    fmt::format("{} ms", mine.budget_us / 1e3) + rank_k + fmt::format("{} ms", d.budget_us / 1e3));
      }
      if (d.kind != mine.kind || d.dtype != mine.dtype || d.bytes != mine.bytes || d.root != mine.root ||
          d.op != mine.op || d.timing != mine.timing) {
        throw Error("collective mismatch among the ranks of this node: " + ranks_of + "is in " + describe(mine) +
                    rank_k + "in " + describe(d));
      }
      if (d.algorithm != mine.algorithm) {  // the same settings and choices give the same algorithm
        throw Error("shm: the ranks of this node chose different algorithms for " + describe(mine) + ": " + ranks_of +
                    shm::algorithm_name(static_cast<Algorithm>(mine.algorithm)) + rank_k +
                    shm::algorithm_name(static_cast<Algorithm>(d.algorithm)));
      }
    }
  }

  // ---- Which variant a call runs ------------------------------------------------------------

  // The variant for this call, decided before its first phase (so every rank
  // asks at the same point of the same call): forced, or this node's choice
  // for the call's size class, timed first when there is none yet (once the
  // timing budget is spent: the nearest timed class's choice). Tables
  // start equal on every rank (local rank 0's tune file) and change only by
  // choices every rank derives from the same timings, so all ranks agree.
  Algorithm algorithm_for_call(Collective c, std::size_t bytes, DType dtype, std::int32_t op, int root) {
    if (forced_.of(c) != Algorithm::kAuto) return forced_.of(c);
    if (cross_) return Algorithm::kPush;  // across nodes nothing is timed: push within the node, then Gloo
    const auto key = std::make_pair(c, shm::size_class(bytes));
    {
      std::lock_guard<std::mutex> lock(choices_mu_);
      if (auto it = choices_.find(key); it != choices_.end()) return it->second;
    }
    if (timing_spent_ms_ >= budget_ms_) {
      // Identical on every rank: the spent time adds up the same published timings.
      std::lock_guard<std::mutex> lock(choices_mu_);
      const Algorithm near = shm::nearest_choice(choices_, c, key.second, segment().geometry().small_bytes)
                                 .value_or(Algorithm::kChunked);
      choices_[key] = near;
      sources_[key] = Source::kNearest;
      return near;
    }
    const auto [chosen, timed] = choose_by_timing(c, bytes, dtype, op, root);
    {
      std::lock_guard<std::mutex> lock(choices_mu_);
      choices_[key] = chosen;
      sources_[key] = timed ? Source::kTimed : Source::kNoRoom;
    }
    if (timing_spent_ms_ >= budget_ms_) {
      log::write(log::Level::kDebug, false,
                 fmt::format("shm: the timing budget of {} ms (DDP_SHM_TUNE_BUDGET_MS) is spent; size classes "
                             "not timed yet take the nearest timed class's choice",
                             budget_ms_));
    }
    if (timed && me_ == 0 && !tune_path_.empty()) save_tune_file();
    return chosen;
  }

  // Why a class has its choice (what algorithm_for() says).
  enum class Source { kTimed, kFile, kNearest, kNoRoom };
  static const char* source_name(Source s) {
    switch (s) {
      case Source::kTimed: return "timed";
      case Source::kFile: return "DDP_SHM_TUNE_FILE";
      case Source::kNearest: return "as the nearest timed class: timing budget spent";
      case Source::kNoRoom: return "untimed: no room for scratch";
    }
    return "?";
  }

  // Every local rank runs each candidate on scratch buffers in the segment
  // (zeros; the call's dtype, op, root and size, at most kLargestTimedBytes
  // in all): once to warm up, then `reps` times, keeping its fastest run.
  // The ranks publish those times and each picks, from the same table, the
  // candidate whose slowest rank was fastest. {chunked, false} without
  // timing when some rank has no room for scratch.
  std::pair<Algorithm, bool> choose_by_timing(Collective c, std::size_t bytes, DType dtype, std::int32_t op, int root) {
    const auto started = Clock::now();
    const std::vector<Algorithm> candidates = shm::candidates(c, bytes, segment().geometry().small_bytes);
    const std::size_t element = dtype_size(dtype);
    const std::size_t blocks = c == Collective::kReduceScatter || c == Collective::kAllGather ? local_size_ : 1;
    const std::size_t count = std::max<std::size_t>(1, std::min(bytes, shm::kLargestTimedBytes / blocks) / element);
    const std::size_t block = count * element;
    // reduce_scatter's output follows its input.
    const std::size_t scratch_bytes = block * (blocks + (c == Collective::kReduceScatter ? 1 : 0));
    std::string why;
    const std::optional<std::size_t> scratch = take_pages(scratch_bytes, &why, true);
    const std::int64_t at = scratch ? static_cast<std::int64_t>(segment().arena_offset(me_) + *scratch) : -1;
    struct Release {
      ShmBackend* self;
      std::optional<std::size_t> offset;
      std::size_t bytes;
      ~Release() {
        if (offset) self->give_pages_back(*offset, bytes);
      }
    } release{this, scratch, scratch_bytes};
    Descriptor announce = descriptor(kind_of(c), dtype, block, root, op, Algorithm::kAuto, true);
    announce.offset = at;
    begin(announce);
    if (!all_in_segment()) {
      log::write(log::Level::kDebug, false,
                 std::string("shm: no room to time ") + shm::collective_name(c) + " (" +
                     (scratch ? "another rank's arena" : why) + "); it runs through the chunk slots");
      return {Algorithm::kChunked, false};
    }
    char* p = segment().base() + at;
    const std::size_t total = block * blocks;
    // Fewer runs where each takes longer (a 16 MiB push here: about 3 ms); noise matters less there.
    const int reps = total <= (256u << 10) ? 8 : total <= (2u << 20) ? 4 : total <= (8u << 20) ? 2 : 1;
    double* mine = segment().control(me_).timings;
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      double best = std::numeric_limits<double>::infinity();
      for (int r = 0; r <= reps; ++r) {  // the first run warms up
        const auto start = Clock::now();
        run_variant(c, candidates[i], p, count, dtype, op, root);
        if (r > 0) best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
      }
      mine[i] = best;
    }
    sync_->phase(deadline_);  // every rank's times are published
    std::vector<std::vector<double>> seconds(local_size_, std::vector<double>(candidates.size()));
    for (int k = 0; k < local_size_; ++k) {
      for (std::size_t i = 0; i < candidates.size(); ++i) seconds[k][i] = segment().control(k).timings[i];
    }
    std::vector<double> slowest;
    const Algorithm chosen = candidates[shm::choose(seconds, &slowest)];
    // The slowest rank's runs: the same sum on every rank.
    for (double t : slowest) timing_spent_ms_ += t * (reps + 1) * 1e3;
    if (log::enabled(log::Level::kDebug)) {
      std::string times;
      for (std::size_t i = 0; i < candidates.size(); ++i) {
        times += fmt::format("{}{} {:.1f} us", i ? ", " : "", shm::algorithm_name(candidates[i]), slowest[i] * 1e6);
      }
      const int cls = shm::size_class(bytes);
      log::write(log::Level::kDebug, false,
                 fmt::format("shm: {} calls {} on {} local ranks, timed at {} bytes per rank: {} (slowest rank's "
                             "best) -> {}; timing took {:.1f} ms",
                             shm::collective_name(c),
                             cls == shm::kLastClass ? "over 16 MiB" : "up to " + std::to_string(shm::class_limit(cls)) +
                                                                          " bytes",
                             local_size_, block, times, shm::algorithm_name(chosen),
                             std::chrono::duration<double, std::milli>(Clock::now() - started).count()));
    }
    return {chosen, true};
  }

  // One run of variant `a` of `c` on scratch at `p` (see choose_by_timing).
  void run_variant(Collective c, Algorithm a, char* p, std::size_t count, DType dtype, std::int32_t op, int root) {
    const std::size_t block = count * dtype_size(dtype);
    const auto reduce_op = static_cast<ReduceOp>(std::max(op, 0));
    switch (c) {
      case Collective::kAllReduce:
        return run_all_reduce(a, p, count, dtype, reduce_op, nullptr, true);
      case Collective::kReduceScatter:
        return run_reduce_scatter(a, p, p + block * static_cast<std::size_t>(local_size_), count, dtype, reduce_op,
                                  true);
      case Collective::kAllGather:
        return run_all_gather(a, p + block * static_cast<std::size_t>(me_), p, count, dtype, true);
      case Collective::kBroadcast:
        return run_broadcast(a, p, count, dtype, root, true);
    }
  }

  // Local rank 0: DDP_SHM_TUNE_FILE with this node's timed choices merged in
  // (a warning naming the file, once, when it cannot be written).
  void save_tune_file() {
    shm::ChoiceTable known;
    {
      std::lock_guard<std::mutex> lock(choices_mu_);
      for (const auto& [key, source] : sources_) {
        if (source == Source::kTimed || source == Source::kFile) known[key] = choices_.at(key);
      }
    }
    static const std::string model = shm::cpu_model();  // read once per process
    const std::string why = shm::write_tune_file(
        tune_path_, shm::format_tune_file(shm::merged(tune_entries_, local_size_, known),
                                          model.empty() ? "" : "timed on " + model));
    if (!why.empty() && !tune_warned_) {
      tune_warned_ = true;
      log::write(log::Level::kWarn, true, "shm: could not save the algorithm choices to DDP_SHM_TUNE_FILE: " + why);
    }
  }

  // ---- The collectives' variants ------------------------------------------------------------

  void run_all_reduce(Algorithm a, void* data, std::size_t count, DType dtype, ReduceOp op,
                      const std::vector<ElementRange>* needed, bool timing) {
    const std::size_t bytes = count * dtype_size(dtype);
    Descriptor d = descriptor(Kind::kAllReduce, dtype, bytes, -1, static_cast<std::int32_t>(op), a, timing);
    if (a == Algorithm::kSmall && bytes <= segment().geometry().small_bytes && !cross_) {
      return small_all_reduce(data, count, dtype, op, d);
    }
    d.offset = segment().offset_of(data, bytes);
    begin(d);
    const bool in_place = (a == Algorithm::kPush || a == Algorithm::kPull) && all_in_segment();
    if (in_place && needed != nullptr && !cross_) return zero_copy_partial(count, dtype, op, *needed);
    if (in_place) return zero_copy_all_reduce(count, dtype, op, a == Algorithm::kPull && !cross_);
    chunked_reduce(static_cast<char*>(data), count, dtype, op, -1, nullptr);
  }

  // pull: every rank but the root copies the root's buffer; push: the root
  // writes every other rank's buffer; chunked: through the root's slots.
  void run_broadcast(Algorithm a, void* data, std::size_t count, DType dtype, int root, bool timing) {
    const std::size_t bytes = count * dtype_size(dtype);
    Descriptor d = descriptor(Kind::kBroadcast, dtype, bytes, root, -1, a, timing);
    d.offset = segment().offset_of(data, bytes);
    auto* p = static_cast<char*>(data);
    if (a != Algorithm::kPush && a != Algorithm::kPull) return chunked_broadcast(p, bytes, root, &d);
    begin(d);  // which variant can run depends on where every buffer lives, known once all published
    bool others_in_segment = true;
    for (int k = 0; k < local_size_; ++k) {
      if (k != root && published(k).offset < 0) others_in_segment = false;
    }
    const Algorithm run = runnable(a, published(root).offset >= 0, others_in_segment);
    if (run == Algorithm::kChunked) return chunked_broadcast(p, bytes, root, nullptr);
    if (run == Algorithm::kPull && me_ != root) {
      const char* from = segment().base() + published(root).offset;
      if (from != p) std::memcpy(p, from, bytes);
    }
    if (run == Algorithm::kPush && me_ == root) {
      for (int k = 0; k < local_size_; ++k) {
        char* to = segment().base() + published(k).offset;
        if (k != root && to != p) std::memcpy(to, p, bytes);
      }
    }
    sync_->phase(deadline_);  // pull: the root keeps its buffer until all have read it; push: all are written
  }

  // Broadcast through the root's double-buffered chunk slots; `first`, when
  // given, is published with the first chunk's phase.
  void chunked_broadcast(char* p, std::size_t bytes, int root, const Descriptor* first) {
    const std::size_t chunk = segment().geometry().chunk_bytes;
    for (std::size_t b = 0; b < bytes; b += chunk) {
      const std::size_t len = std::min(chunk, bytes - b);
      char* slot = segment().chunk_slot(root, chunk_parity_++);
      if (me_ == root) std::memcpy(slot, p + b, len);
      if (first != nullptr) {
        begin(*first);
        first = nullptr;
      } else {
        sync_->phase(deadline_);
      }
      if (me_ != root) std::memcpy(p + b, slot, len);
    }
  }

  // pull: each rank copies every rank's input (all in the segment) into its
  // own output, so a line crosses between cores once (read by its new owner);
  // push: each rank writes its input into every rank's output (all in the
  // segment), a line moving twice (taken over to write, read back by its
  // owner); chunked: through every rank's slots.
  void run_all_gather(Algorithm a, const void* in, void* out, std::size_t count, DType dtype, bool timing) {
    const std::size_t bytes = count * dtype_size(dtype), chunk = segment().geometry().chunk_bytes;
    Descriptor d = descriptor(Kind::kAllGather, dtype, bytes, -1, -1, a, timing);
    d.offset = segment().offset_of(out, bytes * static_cast<std::size_t>(local_size_));
    d.input_offset = segment().offset_of(in, bytes);
    begin(d);  // which variant can run depends on where every buffer lives, known once all published
    auto* src = static_cast<const char*>(in);
    auto* dst = static_cast<char*>(out);
    const Algorithm run = runnable(a, all_in_segment(&Descriptor::input_offset), all_in_segment());
    if (run == Algorithm::kPull) {
      for (int k = 0; k < local_size_; ++k) {
        char* to = dst + static_cast<std::size_t>(k) * bytes;
        const char* from = segment().base() + published(k).input_offset;
        if (to != from) std::memmove(to, from, bytes);
      }
      sync_->phase(deadline_);  // nobody returns (and lets its caller change its input) before all have read it
      return;
    }
    if (run == Algorithm::kPush) {
      for (int k = 0; k < local_size_; ++k) {
        char* to = segment().base() + published(k).offset + static_cast<std::size_t>(me_) * bytes;
        if (to != src) std::memmove(to, src, bytes);
      }
      sync_->phase(deadline_);  // nobody reads its output before all wrote it
      return;
    }
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
  }

  // pull (every rank's `in` in the segment): each rank reduces its block
  // straight from the others' inputs; chunked: chunk by chunk through the
  // slots, each rank copying in only the blocks the others reduce.
  void run_reduce_scatter(Algorithm a, const void* in, void* out, std::size_t count, DType dtype, ReduceOp op,
                          bool timing) {
    const std::size_t element = dtype_size(dtype), bytes = count * element;
    Descriptor d = descriptor(Kind::kReduceScatter, dtype, bytes, -1, static_cast<std::int32_t>(op), a, timing);
    d.offset = segment().offset_of(in, bytes * static_cast<std::size_t>(local_size_));
    begin(d);  // which variant can run depends on where every rank's input lives, known once all published
    auto* src = static_cast<const char*>(in);
    auto* dst = static_cast<char*>(out);
    const std::size_t mine = static_cast<std::size_t>(me_) * bytes;
    if (a == Algorithm::kPull && all_in_segment()) {
      const std::size_t block = std::max<std::size_t>(1, kFuseBytes / element);
      for (std::size_t o = 0; o < count; o += block) {
        const std::size_t n = std::min(block, count - o), at = mine + o * element;
        reduce_slice(dst + o * element, src + at, [&](int k) { return segment().base() + published(k).offset + at; },
                     n, dtype, op);
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
  }

  // ---- Pages of this rank's arena -----------------------------------------------------------

  // Takes `bytes` of this rank's arena and faults its pages in now, so a full
  // /dev/shm is ENOSPC here rather than SIGBUS later; `zeroed`: whatever an
  // earlier block left there is dropped first. The offset in the arena, or
  // nullopt with the reason in `why`.
  std::optional<std::size_t> take_pages(std::size_t bytes, std::string* why, bool zeroed = false) {
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

  // Returns take_pages' block and its pages (scratch is not kept resident).
  void give_pages_back(std::size_t offset, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(state_->mu);
    fallocate(segment().fd(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
              static_cast<off_t>(segment().arena_offset(me_) + offset), static_cast<off_t>(page_rounded(bytes)));
    state_->arena->give_back(offset);
  }

  static std::size_t page_rounded(std::size_t bytes) { return (std::max<std::size_t>(bytes, 1) + 4095) / 4096 * 4096; }

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
      if (can_see_creator && detail::proc_says_dead(creator_pid)) {
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
    const std::string tune_key = "shm/tune/node" + std::to_string(config_.node);
    std::string tune_text;  // local rank 0's tune file, for every local rank
    if (me_ == 0) {
      const std::string run = config_.run_id.empty() ? "anon" + std::to_string(getpid()) : config_.run_id;
      const std::string name = shm_segment_name(run, config_.round, config_.group_name, config_.node, random_hex(8));
      if (const char* path = std::getenv("DDP_SHM_TUNE_FILE"); path != nullptr && *path != 0) {
        tune_path_ = path;
        try {
          tune_text = shm::read_tune_file(tune_path_);
          tune_entries_ = shm::parse_tune_file(tune_text, tune_path_);
        } catch (const std::exception& e) {
          config_.store->set(key, "!" + std::string(e.what()));  // peers fail with the reason, not a timeout
          throw;
        }
      }
      config_.store->set(tune_key, tune_text);  // before the segment's name: peers read it once they attached
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
      tune_text = config_.store->get(tune_key, timeout_);
      state_->segment->mark_attached();
      // Peers' pids are known once all attached (they are watched for death).
      state_->segment->wait_attached_and_unlink(deadline);
    }
    choices_ = shm::table_for(
        me_ == 0 ? tune_entries_ : shm::parse_tune_file(tune_text, "of local rank 0 (DDP_SHM_TUNE_FILE)"), local_size_);
    for (const auto& entry : choices_) sources_[entry.first] = Source::kFile;
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
  shm::Forced forced_;  // DDP_SHM_ALGO
  std::string tune_path_;  // DDP_SHM_TUNE_FILE: local rank 0 reads it for every rank and saves new choices
  std::vector<shm::TuneEntry> tune_entries_;  // local rank 0: the file as read (every number of ranks)
  mutable std::mutex choices_mu_;  // the tables: algorithm_for() reads them from any thread
  shm::ChoiceTable choices_;       // every choice made (or read) so far, the same on every local rank
  std::map<std::pair<Collective, int>, Source> sources_;  // why each was made
  double budget_ms_;               // DDP_SHM_TUNE_BUDGET_MS
  double timing_spent_ms_ = 0;     // the slowest rank's timed runs so far (the same on every rank)
  bool tune_warned_ = false;
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
