#pragma once
// SharedGradSum: gradient averaging without collectives, for the ranks of
// one node under the shm backend (or a world of one). The common contract
// (parameters, iterations, threads, errors) is GradAverager's
// (grad_averager.h).
//
//   ddp::SharedGradSum sum(group, params);          // collective
//   sum.prepare(param_data, buffers);
//   for (step...) {
//     sum.begin_backward();
//     for (layer = last..first)
//       sum.contribute(p, [&](const ddp::GradBlock& b) {   // per block of rows:
//         gemm(..., alpha = b.scale, beta = b.accumulate ? 1 : 0, out = b.data);
//       });
//     sum.finish();                                 // waits for the other ranks
//     optimizer_step(sum.grad_view(p) ...);         // the mean, read-only
//   }
//
// How. Every rank adds its gradients straight into ONE node-shared sum,
// block of rows by block of rows, each block held by one rank at a time: the
// first rank to reach a block in an accumulation window stores into it, the
// others add (a GEMM's beta = 0 or 1), so the reduction happens inside the
// writes that produce the gradients, with no pass or thread of its own.
//
// Hand-over. contribute(index, write) calls write(block) once per block of
// the parameter's rows (rows = shape[0]; a scalar is one row); write must
// store (block.accumulate false) or add (true) block.scale (= grad_scale())
// times this rank's gradient of those rows at block.data. add_grad()/
// set_grad() are contribute() with a copy: both ADD this rank's
// contribution (a window's sum starts from zero by itself, so zero_grad()
// does nothing). Gradients are float32/float64/float16/bfloat16 in host
// memory. Inside no_sync iterations contributions add to the same sum; only
// the synced finish() waits for the other ranks.
//
// Result. After a synced finish(), grad()/grad_view() point at the window's
// mean in node-shared memory: read-only, the same bytes on every rank, valid
// until this rank's next contribute()/add_grad()/set_grad()/finish() (two
// buffers alternate between windows; before the first synced finish() they
// read zeros). Which rank adds to a block first varies between runs, so
// results agree with an all-reduce's, and between runs, to float rounding.
//
// Unused parameters. A parameter not contributed by finish() counts as zeros
// (nobody waits for it); without find_unused_parameters the synced finish()
// then throws on every rank, naming it.
//
// Failures. Waiting for blocks or for other ranks fails at once, naming the
// rank waited for, when its process has exited, and after the group's
// timeout when it is stuck; after that every contribute()/finish() throws
// (the sum is lost).
//
// Memory. 2 x the gradients (64-byte aligned per parameter) from
// ProcessGroup::allocate_node_shared, which stays the group's until the group
// is destroyed: create one SharedGradSum per group and model, not per step.
//
// Statistics: comm_ms = exposed_comm_ms = the time spent waiting for other
// ranks (blocks they held, and in finish()); overlap_ms, buckets and
// bytes_on_wire are 0: the reduction's cost is inside backward_compute_ms.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ddp/grad_averager.h"
#include "ddp/process_group.h"

namespace ddp {

class SharedGradSum final : public GradAverager {
 public:
  // Collective over `group` (the ranks of one node under shm, or a world of
  // one). Reads find_unused_parameters, log_every, shared_block_bytes and
  // broadcast_chunk_bytes; options().comm_mode reads kShared whatever was
  // passed, and compression must be kNone. Every rank must build a
  // SharedGradSum (a rank building a GradSync is named). Throws ddp::Error
  // when the group has no node-shared memory, naming the backend.
  SharedGradSum(std::shared_ptr<ProcessGroup> group, std::vector<GradParam> params,
                GradSyncOptions options = {});
  SharedGradSum(ProcessGroup& group, std::vector<GradParam> params, GradSyncOptions options = {});
  ~SharedGradSum() override;

  // The last synced window's mean (see Result).
  void* grad(std::size_t index) override;
  // contribute() with a copy of src (count() elements), scaled by grad_scale().
  void set_grad(std::size_t index, const void* src) override;
  void add_grad(std::size_t index, const void* src) override;
  // Nothing to do (checks it is called between iterations).
  void zero_grad() override;
  // set_needed_gradients() changes nothing here (every element is summed).

  // Adds this rank's gradient of parameter `index` to the node's sum through
  // write() (see Hand-over; block.scale is grad_scale()). May wait for blocks
  // other ranks hold, and names the holder when that wait fails.
  void contribute(std::size_t index, const std::function<void(const GradBlock&)>& write) override;

  void finish() override;

 private:
  struct Impl;  // the implementation's state
  Impl& impl() const;
};

}  // namespace ddp
