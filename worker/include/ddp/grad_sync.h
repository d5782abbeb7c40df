#pragma once
// GradSync: bucketed, overlapped gradient averaging across the ranks of a
// process group — the bucket manager of data-parallel training (torch DDP's
// Reducer, the Python BucketManager users know), for C++/CUDA trainers.
//
//   ddp::GradSync sync(group, params);              // collective: checks params
//   sync.prepare(param_data, buffers);               // collective: rank 0's values everywhere
//   for (step...) {
//     forward();
//     sync.begin_backward();                         // optional: times the whole backward
//     for (layer = last..first) {
//       compute_grad(layer, sync.grad_view(p));      // write the gradient in place...
//       sync.mark_ready(p);                          // ...bucket full: its all_reduce starts now
//     }
//     sync.finish();                                 // waits; views hold the averaged gradients
//     optimizer_step(sync.grad_view(p) ...);         // re-fetch views (see "Layout")
//     sync.zero_grad();                              // if backward accumulates with +=
//   }
//
// Parameters are identified by their index in the list given to the
// constructor (index_of() maps a name to it).
//
// Layout. Gradients live in contiguous bucket buffers from
// ProcessGroup::allocate() (host memory for gloo/local, device memory for
// nccl), packed as bucket_layout.h describes: reverse registration order,
// one (dtype, device) per bucket, the first bucket small. Each parameter's
// gradient is a view into its bucket (grad(), grad_view()): the trainer writes
// it in place and nothing is copied. The layout is rebuilt ONCE, at the end
// of the first finish() that succeeds, from the order in which rank 0 marked
// gradients ready in that iteration (broadcast, so every rank builds the same
// layout), so buckets fill in the order the backward pass really produces
// gradients. The rebuild keeps every gradient's current values, but MOVES the
// views: pointers from grad()/grad_view() are valid until the next layout
// change (layout_version() increments at each one: the rebuild and
// set_first_bucket_bytes()). The simplest rule: fetch views through grad()
// each step (it is an O(1) lookup).
//
// Iterations. An iteration is everything between two finish() calls (or
// construction and the first finish()). Every parameter with a gradient is
// marked ready once per iteration; marking one twice throws ddp::Error naming
// it. Buckets are launched strictly in index order on every rank: a bucket
// whose parameters are all ready waits for its predecessors, so ranks issue
// identical collectives whatever order their gradients arrive in. finish()
// must end every iteration, no_sync ones included.
//
// Scaling. The result is the mean over ranks. Gradients written through views
// are summed and divided after the reduction (ReduceOp::kAvg, on the group's
// thread). add_grad()/set_grad() copy a gradient in and fuse the 1/world_size
// factor into that copy, so the reduction is a plain sum; with
// `prescaled_grads` the trainer promises its view writes are already
// multiplied by grad_scale() (e.g. as a GEMM's alpha), which saves the divide.
// Use one path per parameter within an accumulation window.
//
// Unused parameters. A parameter never marked ready by finish() makes
// finish() throw ddp::Error listing the names — on every rank: the ranks still
// launch every bucket (with zeros for the missing gradients) and a status word
// travels in the last bucket, so nobody hangs and every rank learns that the
// iteration is invalid. With `find_unused_parameters`, such parameters count
// as zero gradients (their views are zeroed unless an earlier no_sync step
// accumulated into them) and finish() succeeds.
//
// Accumulation. Inside a no_sync() scope iterations do no communication: the
// trainer accumulates into the views (+=, or add_grad), and the next synced
// iteration reduces the accumulated sum. The mode of an iteration is fixed by
// its first begin_backward()/mark_ready()/add_grad()/set_grad() (or by
// finish() for an empty iteration).
//
// Compression. With fp16/bf16 compression, float32 and float64 buckets travel
// as half/bfloat16: each gradient is divided by world_size while it is
// converted (so the sum cannot overflow where the mean would not), reduced
// as a sum, and converted back into the full-precision bucket. Other buckets
// and a world of one are not compressed. Host buckets only: compression with
// device (nccl) buckets is refused at construction.
//
// Device memory (nccl). Bucket buffers are device memory; GradSync itself
// never touches their contents on the CPU: reductions use kAvg (or kSum with
// prescaled_grads), zero_grad/unused-parameter zeroing use cudaMemset,
// set_grad uses cudaMemcpy (copied as is: no fused scaling), add_grad is
// refused (accumulate in your kernels), and compression is refused. A
// parameter on a device with a host backend (or on the host with nccl) is
// refused at construction, naming it. mark_ready() on a device gradient means
// its kernels have completed: synchronize the stream that wrote it first.
//
// Communication (comm_mode). kOverlap (default): a bucket's all-reduce is
// handed to the group's thread and runs while the backward pass goes on.
// kInline: it runs on the caller's thread, inside the mark_ready() (or
// finish()) that completes the bucket, between two layers of the backward
// pass: no second thread competing for the cores when the node runs as many
// ranks as it has cores, at the price of every bucket being a point where the
// ranks wait for each other. Either way, errors of the collectives are
// thrown by finish(); after one, an inline iteration issues no further
// collectives (so a dead peer costs one timeout, not one per bucket).
// kShared (ranks of one node under shm, or a world of one): no collective
// at all. The ranks add their gradients straight into one node-shared sum,
// block of rows by block of rows, each block held by one rank at a time: the
// first rank to reach a block in a window sets it, the others add to it (a
// GEMM's beta = 0 or 1), so the reduction happens inside the writes that
// produce the gradients. See "The shared sum" below.
//
// The shared sum (CommMode::kShared). Gradients are handed over with
// contribute(index, write) instead of view writes plus mark_ready() (which
// throws in this mode): write(block) is called once per block of the
// parameter's rows (rows = shape[0]; a scalar is one row) and must store
// (block.accumulate false) or add (true) grad_scale() times this rank's
// gradient of those rows at block.data; contribute() marks the parameter
// ready. add_grad()/set_grad() are contribute() with a copy (both ADD this
// rank's contribution: a window's sum starts from zero by itself, so
// zero_grad() has nothing to do). Gradients must be float32/float64/
// float16/bfloat16 in host memory; compression is refused. After finish()
// of a synced iteration, grad()/grad_view() point at the window's mean in
// node-shared memory, read-only, the same bytes on every rank, valid until
// this rank's next contribute()/add_grad()/set_grad()/finish() (two buffers
// alternate between windows; before the first synced finish() they read
// zeros). Every rank reads the same bytes, so replicas never drift apart;
// but which rank adds to a block first varies from run to run (and a GEMM
// that adds rounds differently from one that stores), so results agree with
// the all-reduce's, and between runs, to float rounding, not bit for bit.
// Accumulation (no_sync) adds into the same sum: every iteration
// of a window contributes, only the synced finish() waits. A parameter not
// contributed by finish() counts as a zero contribution (so nobody waits for
// it); without find_unused_parameters the synced finish() then throws on
// every rank, naming it. The sum's memory (2 x the gradients, from
// ProcessGroup::allocate_node_shared) stays the group's until the group is
// destroyed, so create one shared-sum GradSync per group and model, not one
// per step. layout() is empty (no buckets), set_first_bucket_bytes()
// throws, set_needed_gradients() changes nothing (every element is summed).
// Waiting for blocks or for other ranks fails at once, naming the rank
// waited for, when that rank's process has exited, and after the group's
// timeout when it is stopped or stuck; after such a failure every later
// contribute()/finish() throws (the sum is lost). Statistics: exposed_comm_ms = comm_ms = the
// time spent waiting for other ranks (blocks they held, and in finish());
// overlap_ms, buckets and bytes_on_wire are 0: the reduction's own cost is
// inside the writes, i.e. inside backward_compute_ms.
//
// Statistics (stats()), per iteration, like torch DDP's logging data:
//   backward_compute_ms  begin_backward() (else the iteration's first
//                        mark_ready/add_grad/set_grad) .. its last mark_ready,
//                        less the inline collectives run in between;
//   comm_ms              first bucket launched .. last bucket reduced
//                        (completion is observed at mark_ready calls and in
//                        finish(), so early completions are approximate);
//   overlap_ms           the part of comm_ms inside the backward window (0
//                        with kInline: nothing runs beside the backward);
//   exposed_comm_ms      time finish() spent waiting for (and unpacking) the
//                        reductions, plus (kInline) the inline collectives run
//                        inside mark_ready calls, which nothing hides;
//   inline_comm_ms       time the caller's thread spent running collectives
//                        itself (kInline; inside mark_ready calls and finish).
// Rank 0 logs them (ddp::log::info) at iterations 1-10 and then every
// `log_every` iterations.
//
// Thread-safety: mark_ready(), add_grad() and set_grad() may be called from
// several threads at once (as autograd hooks would); everything else from one
// thread, between iterations where stated. Errors are ddp::Error.

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/bucket_layout.h"
#include "ddp/params.h"
#include "ddp/process_group.h"
#include "ddp/types.h"
#include "ddp/work.h"

namespace ddp {

namespace detail {
class SharedSum;
}

enum class Compression : int { kNone, kFp16, kBf16 };
const char* compression_name(Compression compression);  // "none", "fp16", "bf16"

// Where bucket all-reduces run (see "Communication").
enum class CommMode : int { kOverlap, kInline, kShared };
const char* comm_mode_name(CommMode mode);  // "overlap", "inline", "shared"

// A parameter: what every rank must agree on (name, shape, dtype), where its
// memory is, and whether it has a gradient.
struct GradParam {
  std::string name;
  std::vector<std::int64_t> shape;  // elements = product ([] is a scalar)
  DType dtype = DType::kFloat32;    // float32, float64, float16 or bfloat16 when trainable
  int device = -1;                  // -1: host memory; >= 0: CUDA device (nccl)
  bool requires_grad = true;        // false: frozen (checked and broadcast, no gradient)

  std::size_t count() const;
};

// One block of a parameter's gradient handed to contribute()'s writer
// (CommMode::kShared): rows [row_begin, row_begin + rows), row_elements
// elements each, of the parameter's dtype, at `data` inside the node's sum.
struct GradBlock {
  void* data = nullptr;
  std::int64_t row_begin = 0;
  std::int64_t rows = 0;
  std::size_t row_elements = 0;
  bool accumulate = false;  // false: store scale * gradient; true: add it
  float scale = 1.0f;       // grad_scale(): 1 / world_size
};

struct GradSyncOptions {
  std::size_t bucket_cap_bytes = std::size_t{25} << 20;   // 25 MiB, like torch DDP
  std::size_t first_bucket_bytes = std::size_t{1} << 20;  // 1 MiB
  Compression compression = Compression::kNone;
  bool find_unused_parameters = false;
  // View writes are already multiplied by grad_scale() (see "Scaling").
  bool prescaled_grads = false;
  // Rebuild the layout once from the observed ready order (see "Layout").
  bool rebuild_buckets = true;
  // Rank 0 logs statistics at iterations 1-10, then every log_every (0: never after 10).
  int log_every = 100;
  CommMode comm_mode = CommMode::kOverlap;
  // kShared: parameters are cut into blocks of rows of about this size (at
  // most 2 x world_size blocks each), so ranks that reach a parameter together
  // add to different blocks.
  std::size_t shared_block_bytes = std::size_t{256} << 10;
  // Largest collective prepare() issues (like torch DDP's 250 MiB).
  std::size_t broadcast_chunk_bytes = std::size_t{250} << 20;
};

// One iteration's figures (see "Statistics").
struct IterationStats {
  std::uint64_t iteration = 0;  // 1-based: the finish() calls so far
  bool synced = false;          // false: a no_sync iteration (no communication)
  double backward_compute_ms = 0;
  double comm_ms = 0;
  double overlap_ms = 0;
  double exposed_comm_ms = 0;
  double inline_comm_ms = 0;
  std::size_t buckets = 0;        // collectives issued
  std::size_t bytes_on_wire = 0;  // bytes all-reduced (compressed size when compressing)
};

struct GradSyncStats {
  IterationStats last;           // the latest iteration
  IterationStats mean;           // means over the synced iterations (iteration = their count)
  std::uint64_t iterations = 0;  // finish() calls that returned or threw
  std::uint64_t synced_iterations = 0;
};

class GradSync {
 public:
  // Collective over `group`: every rank constructs its GradSync at the same
  // point with the same parameters and options. Checks, in two small
  // all_gathers, that every rank passes the same options (a rank that
  // differs is named) and the same parameters (check_same_params: count,
  // names, shapes, dtypes; the first difference and the rank that has it),
  // then lays out and allocates the buckets (zeroed). Throws ddp::Error on
  // every rank when any check fails.
  GradSync(std::shared_ptr<ProcessGroup> group, std::vector<GradParam> params,
           GradSyncOptions options = {});
  // The same, on a group the caller keeps alive longer than this object.
  GradSync(ProcessGroup& group, std::vector<GradParam> params, GradSyncOptions options = {});
  // Waits for collectives still in flight (never throws).
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // Collective: every rank's parameter values and buffers become rank 0's
  // (broadcast_params, in collectives of at most broadcast_chunk_bytes).
  // param_data[i] holds parameter i's values (count() elements of its dtype;
  // frozen ones included; host memory, device memory with nccl). Call it once
  // before the first iteration, unless every rank initialised identically.
  // REQUIRES: param_data.size() == num_params(); between iterations.
  void prepare(const std::vector<void*>& param_data, const std::vector<ParamBuffer>& buffers = {});

  ProcessGroup& group() const { return *group_; }
  std::size_t num_params() const { return params_.size(); }
  const GradParam& param(std::size_t index) const;
  // The index of the parameter called `name`; throws ddp::Error when none is.
  std::size_t index_of(std::string_view name) const;

  // Parameter `index`'s gradient: count() elements of its dtype inside its
  // bucket (device memory with nccl). Valid until layout_version() changes.
  // Throws for a frozen parameter or an index out of range.
  void* grad(std::size_t index);
  // The same, typed: throws unless the parameter is float32.
  float* grad_view(std::size_t index);
  // 1 / world_size: the factor of prescaled gradients.
  float grad_scale() const { return 1.0f / static_cast<float>(group_->size()); }

  // Copy-in path: grad = src * scale (set_grad) or grad += src * scale
  // (add_grad), src holding count() elements of the parameter's dtype, with
  // scale = 1/world_size fused into the copy. Neither marks the parameter
  // ready. Device buckets: set_grad copies as is (cudaMemcpy), add_grad throws.
  void set_grad(std::size_t index, const void* src);
  void add_grad(std::size_t index, const void* src);
  // Zeroes every gradient. REQUIRES: between iterations.
  void zero_grad();

  // CommMode::kShared: adds this rank's gradient of parameter `index` to the
  // node's sum, calling write() once per block of rows (see "The shared
  // sum"), and marks the parameter ready. May wait for blocks other ranks
  // hold. Throws ddp::Error in other modes, when the parameter was already
  // handed over in this iteration, is frozen or out of range (naming it), or
  // when a block stays held past the group's timeout (naming the holder);
  // write()'s exceptions propagate (the iteration is then lost).
  void contribute(std::size_t index, const std::function<void(const GradBlock&)>& write);

  // Optional: marks the start of this iteration's backward pass (stats).
  void begin_backward();
  // Parameter `index`'s gradient is complete for this iteration; when its
  // bucket and every bucket before it are complete, their all_reduces start.
  // Throws when the parameter was already marked in this iteration, is
  // frozen, or is out of range (naming it).
  void mark_ready(std::size_t index);
  // Ends the iteration. Synced: launches what was not launched yet, waits for
  // every bucket and leaves the averaged gradients in the views; throws
  // listing parameters never marked ready (see "Unused parameters"), or the
  // collective's error. no_sync: no communication. Rebuilds the layout once
  // (see "Layout") and logs statistics on rank 0.
  void finish();
  void wait() { finish(); }

  // Gradient accumulation: iterations begun while a NoSync is alive do not
  // communicate. Scopes nest.
  class [[nodiscard]] NoSync {
   public:
    explicit NoSync(GradSync& sync) : sync_(&sync) { sync_->begin_no_sync(); }
    ~NoSync() {
      if (sync_) sync_->end_no_sync();
    }
    NoSync(NoSync&& other) noexcept : sync_(other.sync_) { other.sync_ = nullptr; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;

   private:
    GradSync* sync_;
  };
  NoSync no_sync() { return NoSync(*this); }
  // What NoSync does (for the C API): depth counts nest.
  void begin_no_sync();
  void end_no_sync() noexcept;
  bool sync_enabled() const;

  // ZeRO-style sharding: `per_param[i]` are the elements of parameter i's
  // gradient this rank reads after finish() (a sharded optimizer reads only
  // what it updates, e.g. ParamShards::owned(i)); finish() then guarantees
  // the averages only there, the rest of the views are unspecified. Ranks'
  // ranges must not overlap (each element is read by one rank at most). With
  // shm and buckets from allocate() each rank reduces just its elements
  // (ProcessGroup::all_reduce_partial: about half the memory traffic on one
  // node; the same bits); elsewhere, and for compressed or device buckets,
  // every bucket is still all-reduced. An empty vector restores full
  // all-reduces. Throws ddp::Error for a wrong count or a range outside its
  // parameter. REQUIRES: between iterations; every rank calls it.
  void set_needed_gradients(std::vector<ElementRange> per_param);
  bool partial() const { return !needed_.empty(); }

  // Changes the first bucket's size limit and lays the buckets out again at
  // once (same order; gradient values kept; views move). Every rank must call
  // it with the same value between the same iterations.
  // REQUIRES: between iterations; bytes > 0.
  void set_first_bucket_bytes(std::size_t bytes);
  const GradSyncOptions& options() const { return options_; }
  CommMode comm_mode() const { return options_.comm_mode; }

  const BucketLayout& layout() const { return layout_; }
  // 0 initially; +1 at every layout change.
  int layout_version() const { return layout_version_; }
  GradSyncStats stats() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Bucket;

  void init();
  void validate_locally(std::string* problem) const;
  void check_across_ranks(const std::string& problem);
  void apply_layout(BucketLayout layout, bool keep_values);
  void require_between_iterations(const char* what) const;
  void begin_iteration_locked(Clock::time_point now);
  std::size_t checked_trainable(std::size_t index, const char* what) const;
  void copy_in(std::size_t index, const void* src, bool accumulate);
  void launch_ready_locked(bool status);
  void launch_locked(std::size_t b, bool status);
  void start_all_reduce(Bucket& bucket, void* data, std::size_t count, DType dtype, ReduceOp op,
                        const std::vector<ElementRange>* needed = nullptr);
  void poll_completions_locked(Clock::time_point now);
  void record_iteration_locked(bool synced, Clock::time_point enter, Clock::time_point done);
  void maybe_rebuild();
  void log_iteration(const IterationStats& s) const;
  void zero_bytes(void* p, std::size_t bytes);
  std::string param_list(const std::vector<std::size_t>& indices) const;
  // Marks parameter `index` handed over in this iteration; throws (naming
  // it, `what` the caller, `done` the past tense) when it already was.
  void mark_once_locked(std::size_t index, const char* what, const char* done);
  // Trainable parameters not marked (handed over) in this iteration.
  std::vector<std::size_t> unmarked_locked() const;
  void init_shared_sum();
  void contribute_copy(std::size_t index, const void* src);
  void finish_shared(Clock::time_point enter, std::unique_lock<std::mutex>& lock);
  bool shared() const { return shared_sum_ != nullptr; }

  std::shared_ptr<ProcessGroup> owned_group_;
  ProcessGroup* group_;
  std::vector<GradParam> params_;
  GradSyncOptions options_;
  bool device_buckets_ = false;  // bucket memory is CUDA device memory
  bool inline_ = false;          // collectives on the caller's thread (CommMode::kInline)

  BucketLayout layout_;
  int layout_version_ = 0;
  std::vector<std::unique_ptr<Bucket>> buckets_;

  mutable std::mutex mu_;  // guards the iteration state below
  int no_sync_depth_ = 0;
  bool in_iteration_ = false;
  bool iteration_sync_ = true;
  std::vector<char> marked_;         // per parameter: marked in this iteration
  std::vector<char> marked_window_;  // per parameter: marked since the last synced iteration
  std::vector<char> scaled_;         // per parameter: values carry the 1/world_size factor
  std::vector<char> known_zero_;     // per parameter: the view is known to hold zeros
  std::vector<ElementRange> needed_;  // set_needed_gradients; empty: full all-reduces
  std::size_t next_launch_ = 0;
  std::size_t oldest_unfinished_ = 0;
  std::vector<std::size_t> observed_order_;
  bool rebuilt_ = false;
  bool record_order_ = true;

  // Timing of the current iteration.
  Clock::time_point backward_start_{}, last_mark_{}, first_launch_{};
  bool have_backward_start_ = false, have_last_mark_ = false, have_first_launch_ = false;
  std::size_t wire_bytes_ = 0, launched_count_ = 0;
  double inline_ms_ = 0, inline_finish_ms_ = 0;  // this iteration's inline collectives: all, in finish()
  std::exception_ptr inline_error_;  // the iteration's first inline failure

  IterationStats last_;
  IterationStats sum_;
  std::uint64_t iterations_ = 0, synced_iterations_ = 0;

  // CommMode::kShared: the node's sum and its memory.
  std::shared_ptr<void> shared_memory_;
  std::unique_ptr<detail::SharedSum> shared_sum_;
  std::uint64_t window_round_ = 0;  // the round (iteration index) the current window began at
  double shared_wait_ms_ = 0;       // this iteration's waits for blocks other ranks held
  std::string shared_broken_;       // a wait timed out: the sums are lost from then on
};

}  // namespace ddp
