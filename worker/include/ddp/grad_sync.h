#pragma once
// GradSync: bucketed, overlapped gradient averaging across the ranks of a
// process group: the bucket manager of data-parallel training (torch DDP's
// Reducer), for C++/CUDA trainers. The common contract (parameters,
// iterations, threads, errors) is GradAverager's (grad_averager.h); for the
// ranks of one node, SharedGradSum (shared_grad_sum.h) averages without
// collectives.
//
//   ddp::GradSync sync(group, params);              // collective: checks params
//   sync.prepare(param_data, buffers);               // collective: rank 0's values everywhere
//   for (step...) {
//     sync.begin_backward();                         // optional: times the backward
//     for (layer = last..first) {
//       compute_grad(layer, sync.grad_view(p));      // write the gradient in place...
//       sync.mark_ready(p);                          // ...bucket full: its all_reduce starts
//       // or: sync.contribute(p, [&](const ddp::GradBlock& b) {   // stores or adds,
//       //   gemm(..., beta = b.accumulate ? 1 : 0, out = b.data); // then marks ready
//       // });
//     }
//     sync.finish();                                 // waits; views hold the mean
//     optimizer_step(sync.grad_view(p) ...);         // re-fetch views (see Memory)
//     sync.zero_grad();                              // if backward accumulates with +=
//   }
//
// Memory. Gradients live in bucket buffers from ProcessGroup::allocate()
// (host memory for gloo/shm/local; CUDA device memory for nccl), packed in
// reverse registration order, one (dtype, device) per bucket, the first one
// small (first_bucket_bytes), none over bucket_cap_bytes unless one gradient
// is. grad() is a view into its bucket: the trainer writes it in place. The
// buckets are laid out again once, at the end of the first successful synced
// finish(), in the order rank 0 marked gradients ready (rebuild_buckets), and
// by set_first_bucket_bytes(); values are kept but views MOVE:
// layout_version() counts these changes. Fetch views each step (O(1)).
// A gradient reads zeros until something writes it; host buckets are zeroed
// a parameter at a time when first needed (its first grad(), mark_ready()
// or add_grad(), or a finish() it was not handed to), never where
// contribute() or set_grad() write it first: a large model's buckets are
// not written twice when a group is rebuilt (live recovery).
//
// Launch order. A bucket's all-reduce starts when all its gradients are
// marked ready AND every bucket before it has started, so every rank issues
// the same collectives in the same order whatever order its gradients come
// in. comm_mode kOverlap runs them on the group's thread while the backward
// pass goes on; kInline on the caller's thread, inside the mark_ready() (or
// finish()) that completes the bucket (no second thread competing for cores;
// after a failure an inline iteration issues no more collectives).
//
// Scaling. Gradients written through views are summed and divided after the
// reduction (kAvg). add_grad()/set_grad() fuse the 1/world_size factor into
// their copy; with prescaled_grads the trainer promises its view writes are
// already multiplied by grad_scale(). Use one path per parameter within an
// accumulation window.
//
// Unused parameters. A parameter not marked ready by a synced finish() is
// reduced as zeros (unless an earlier no_sync iteration accumulated into it)
// and a status word in the last bucket tells every rank: finish() then throws
// on every rank, listing the names where they are missing, unless
// find_unused_parameters.
//
// Compression (fp16/bf16, host buckets only). float32/float64 buckets travel
// as 16-bit values, each divided by world_size while converted (the sum
// cannot overflow where the mean would not), and are widened back in finish().
//
// Device memory (nccl, or a world of one with parameters on a device).
// GradSync never reads device gradients on the CPU: reductions use kAvg (kSum
// when prescaled), zeroing uses cudaMemset, set_grad copies as is (no fused
// scaling), add_grad and compression are refused. mark_ready() on a device
// gradient means the kernels writing it have completed.
//
// Statistics: rank 0 logs stats() at iterations 1-10 and every log_every;
// completions are observed at mark_ready() calls and in finish(), so comm_ms
// of early completions is approximate; overlap_ms is 0 with kInline.

#include <cstddef>
#include <memory>
#include <vector>

#include "ddp/grad_averager.h"
#include "ddp/process_group.h"

namespace ddp {

struct BucketLayout;

class GradSync final : public GradAverager {
 public:
  // Collective over `group`. Reads every option but shared_block_bytes;
  // comm_mode kShared is refused (that is SharedGradSum). Checks, on every
  // rank, the options and parameters (gradient dtypes, host/device memory
  // matching the backend), then lays out and allocates the buckets.
  GradSync(std::shared_ptr<ProcessGroup> group, std::vector<GradParam> params,
           GradSyncOptions options = {});
  // The same, on a group the caller keeps alive longer than this object.
  GradSync(ProcessGroup& group, std::vector<GradParam> params, GradSyncOptions options = {});
  // Waits for collectives still in flight (never throws).
  ~GradSync() override;

  // A view into the parameter's bucket, valid until layout_version() changes.
  void* grad(std::size_t index) override;
  // Neither marks the parameter ready. Device buckets: set_grad copies as
  // is, add_grad throws.
  void set_grad(std::size_t index, const void* src) override;
  void add_grad(std::size_t index, const void* src) override;
  // One block: every row, at the parameter's view; block.scale is
  // grad_scale(), or 1 for a device bucket without prescaled_grads (whose
  // reduction divides). Then mark_ready(index). Device buckets: write's
  // kernels must have completed when it returns.
  void contribute(std::size_t index, const std::function<void(const GradBlock&)>& write) override;
  void zero_grad() override;

  // Parameter `index`'s gradient is complete for this iteration; when its
  // bucket and every bucket before it are complete, their all-reduces start
  // (kInline: run, before this returns). Throws when the parameter was
  // already marked in this iteration, is frozen, or is out of range.
  void mark_ready(std::size_t index);
  // Launches what was not launched, waits for every bucket, widens
  // compressed ones; throws the collectives' first error or the unused
  // parameters (see above). Rebuilds the layout once.
  void finish() override;

  // set_needed_gradients() is in force: with shm and buckets from
  // allocate() each rank reduces just its elements
  // (ProcessGroup::all_reduce_partial); elsewhere, and for compressed or
  // device buckets, every bucket is still all-reduced.
  bool partial() const;

  // Changes the first bucket's size limit and lays the buckets out again at
  // once (same order; values kept; views move). Every rank calls it with the
  // same value between the same iterations. REQUIRES: bytes > 0.
  void set_first_bucket_bytes(std::size_t bytes);
  // The current buckets (bucket_layout.h).
  const BucketLayout& layout() const;
  // 0 initially; +1 at every layout change.
  int layout_version() const;

 private:
  struct Impl;  // the implementation's state
  void use_needed(std::vector<ElementRange> per_param) override;
  Impl& impl() const;
};

}  // namespace ddp
