#pragma once
// GradAverager: what a data-parallel trainer needs from gradient averaging,
// whichever way the ranks average. Two implementations:
//   ddp::GradSync       (grad_sync.h): bucketed all-reduces overlapped with
//                        the backward pass (torch DDP's Reducer), any backend;
//   ddp::SharedGradSum  (shared_grad_sum.h): no collectives, the ranks of one
//                        node add their gradients into one shared buffer.
// make_grad_averager() builds the one options.comm_mode names.
//
// The common contract (each class adds how gradients are handed over):
//
//   Parameters: identified by their index in the constructor's list
//     (index_of() maps a name to it). Construction is collective: every rank
//     passes the same parameters (names, shapes, dtypes) and options, or every
//     rank throws ddp::Error naming a rank that differs and how.
//   Iterations: an iteration is everything between two finish() calls. Its
//     mode (synced, or no_sync: accumulation without communication) is fixed
//     by its first begin_backward() or gradient hand-over. finish() must end
//     every iteration, no_sync ones included. Handing a parameter over twice
//     in one iteration throws, naming it.
//   Result: after a synced finish(), grad(i) holds the mean over ranks of the
//     gradients handed over since the previous synced finish().
//   Units: counts are elements of the parameter's dtype; sizes are bytes;
//     times (stats) are milliseconds of steady_clock.
//   Ownership: the gradient memory belongs to the averager; views returned
//     by grad() stay valid as each class states (re-fetch them each step).
//     The process group must outlive the averager (the shared_ptr
//     constructors keep it alive).
//   Hand-over by writing: contribute(index, write) calls write(block) for
//     blocks of the parameter's rows (GradSync: one block, every row;
//     SharedGradSum: see there); write stores (block.accumulate false) or
//     adds (true) block.scale times this rank's gradient at block.data. The
//     first hand-over of a parameter in an accumulation window stores; later
//     ones in no_sync iterations of the same window add.
//   Threads: hand-overs (mark_ready/contribute, add_grad, set_grad) may come
//     from several threads at once; everything else from one thread.
//   Errors: ddp::Error, naming the parameter (name and index) or the rank.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/params.h"
#include "ddp/process_group.h"
#include "ddp/types.h"

namespace ddp {

enum class Compression : int { kNone, kFp16, kBf16 };
const char* compression_name(Compression compression);  // "none", "fp16", "bf16"

// How gradients are averaged: kOverlap and kInline are GradSync's
// (collectives on the group's thread, or on the caller's between layers);
// kShared is SharedGradSum.
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

// Options of both classes; each states which it reads. Every field but
// log_every must be the same on every rank.
struct GradSyncOptions {
  std::size_t bucket_cap_bytes = std::size_t{25} << 20;   // GradSync: 25 MiB, like torch DDP
  std::size_t first_bucket_bytes = std::size_t{1} << 20;  // GradSync: 1 MiB
  Compression compression = Compression::kNone;           // GradSync, host buckets only
  // A parameter not handed over by a synced finish() counts as zero instead
  // of making finish() throw on every rank.
  bool find_unused_parameters = false;
  // GradSync: view writes are already multiplied by grad_scale().
  bool prescaled_grads = false;
  // GradSync: rebuild the layout once from the observed ready order.
  bool rebuild_buckets = true;
  // Rank 0 logs statistics at iterations 1-10, then every log_every (0: never after 10).
  int log_every = 100;
  CommMode comm_mode = CommMode::kOverlap;
  // SharedGradSum: parameters are cut into blocks of rows of about this size
  // (at most 2 x world_size blocks each).
  std::size_t shared_block_bytes = std::size_t{256} << 10;
  // Largest collective prepare() issues (like torch DDP's 250 MiB).
  std::size_t broadcast_chunk_bytes = std::size_t{250} << 20;
};

// One iteration's figures, like torch DDP's logging data (milliseconds):
//   backward_compute_ms  begin_backward() (else the first hand-over) .. the
//                        last hand-over, less communication run inside it;
//   comm_ms              first collective launched .. last one complete
//                        (SharedGradSum: the time spent waiting for others);
//   overlap_ms           the part of comm_ms inside the backward window;
//   exposed_comm_ms      communication nothing hid: finish()'s waiting, plus
//                        collectives or waits inside the backward window;
//   inline_comm_ms       collectives run on the caller's thread (kInline).
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

// One block of a parameter's gradient handed to contribute()'s writer:
// rows [row_begin, row_begin + rows), row_elements elements each, of the
// parameter's dtype, at `data` (rows = shape[0]; a scalar is one row).
struct GradBlock {
  void* data = nullptr;
  std::int64_t row_begin = 0;
  std::int64_t rows = 0;
  std::size_t row_elements = 0;
  bool accumulate = false;  // false: store scale * gradient; true: add it
  float scale = 1.0f;       // what to multiply this rank's gradient by (each class says)
};

namespace detail {
struct AveragerState;  // the implementation's state
}

class GradAverager {
 public:
  virtual ~GradAverager();
  GradAverager(const GradAverager&) = delete;
  GradAverager& operator=(const GradAverager&) = delete;

  // Collective: every rank's parameter values and buffers become rank 0's
  // (broadcast_params, in collectives of at most broadcast_chunk_bytes).
  // param_data[i] holds parameter i's values (count() elements of its dtype,
  // frozen ones included). REQUIRES: param_data.size() == num_params();
  // between iterations.
  void prepare(const std::vector<void*>& param_data, const std::vector<ParamBuffer>& buffers = {});

  ProcessGroup& group() const;
  std::size_t num_params() const;
  // Throws ddp::Error for an index out of range.
  const GradParam& param(std::size_t index) const;
  // The index of the parameter called `name`; throws ddp::Error when none is.
  std::size_t index_of(std::string_view name) const;
  const GradSyncOptions& options() const;
  CommMode comm_mode() const { return options().comm_mode; }
  // 1 / world_size: the factor gradients are scaled by before summing.
  float grad_scale() const { return 1.0f / static_cast<float>(group().size()); }

  // Parameter `index`'s gradient: count() elements of its dtype. Throws for a
  // frozen parameter or an index out of range. grad_view: the same, typed;
  // throws unless the parameter is float32.
  virtual void* grad(std::size_t index) = 0;
  float* grad_view(std::size_t index);
  // Copy-in hand-over: src holds count() elements of the parameter's dtype,
  // scaled by grad_scale() on the way in (see each class for device memory).
  virtual void set_grad(std::size_t index, const void* src) = 0;
  virtual void add_grad(std::size_t index, const void* src) = 0;
  // Hands parameter `index`'s gradient over by writing it (see Hand-over by
  // writing) and counts it handed over. Throws when the parameter was
  // already handed over in this iteration, is frozen or out of range, or
  // when a wait fails (naming whom); write()'s exceptions propagate, the
  // parameter then counting as not handed over in this window.
  virtual void contribute(std::size_t index,
                          const std::function<void(const GradBlock&)>& write) = 0;
  // Zeroes every gradient. REQUIRES: between iterations.
  virtual void zero_grad() = 0;

  // Optional: marks the start of this iteration's backward pass (stats).
  void begin_backward();
  // Ends the iteration. Synced: waits for every rank's gradients and leaves
  // their mean in grad(); throws when a parameter had no gradient on some
  // rank (unless find_unused_parameters), or the communication's error,
  // on every rank alike. no_sync: no communication. Rank 0 logs stats.
  virtual void finish() = 0;

  // Gradient accumulation: iterations begun while a NoSync is alive do not
  // communicate. Scopes nest.
  class [[nodiscard]] NoSync {
   public:
    explicit NoSync(GradAverager& averager) : averager_(&averager) { averager_->begin_no_sync(); }
    ~NoSync() {
      if (averager_) averager_->end_no_sync();
    }
    NoSync(NoSync&& other) noexcept : averager_(other.averager_) { other.averager_ = nullptr; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;

   private:
    GradAverager* averager_;
  };
  NoSync no_sync() { return NoSync(*this); }
  // No NoSync is alive.
  bool sync_enabled() const;

  // ZeRO-style sharding: `per_param[i]` are the elements of parameter i's
  // gradient this rank reads after finish(); finish() then guarantees the
  // mean only there (GradSync may reduce less; SharedGradSum sums everything
  // anyway). Ranks' ranges must not overlap. An empty vector restores whole
  // gradients. Throws ddp::Error for a wrong count or a range outside its
  // parameter. REQUIRES: between iterations; every rank calls it.
  void set_needed_gradients(std::vector<ElementRange> per_param);

  GradSyncStats stats() const;

 protected:
  explicit GradAverager(std::unique_ptr<detail::AveragerState> state);
  detail::AveragerState& state() const { return *state_; }

 private:
  // What NoSync does: a depth that counts nested scopes.
  void begin_no_sync();
  void end_no_sync() noexcept;
  // set_needed_gradients' checked ranges, for the implementation to use.
  virtual void use_needed(std::vector<ElementRange> /*per_param*/) {}

  std::unique_ptr<detail::AveragerState> state_;
};

// Collective: a SharedGradSum when options.comm_mode is kShared, else a
// GradSync (see their constructors).
std::unique_ptr<GradAverager> make_grad_averager(std::shared_ptr<ProcessGroup> group,
                                                 std::vector<GradParam> params,
                                                 GradSyncOptions options = {});
// The same, on a group the caller keeps alive longer than the result.
std::unique_ptr<GradAverager> make_grad_averager(ProcessGroup& group, std::vector<GradParam> params,
                                                 GradSyncOptions options = {});

}  // namespace ddp
