#pragma once
// ParamShards: sharded optimizer state for data-parallel trainers (ZeRO
// stage 1, torch's ZeroRedundancyOptimizer, DeepSpeed's zero_optimization
// stage 1), on top of GradSync's averaged gradients.
//
// Every rank holds the full parameters and, after GradSync::finish(), the
// full averaged gradients; but each rank runs the optimizer only on the
// elements it owns (owned()), so the optimizer's memory traffic and state are
// divided by the world size, and all_gather() then hands every rank the
// updated elements of the others. Same math as every rank updating
// everything: the runs agree to the last bit as long as the update is
// element-wise (SGD, Adam).
//
//   ddp::ParamShards shards(group, params);     // collective
//   copy each parameter's values into shards.data(i) (node_shared(): on one
//   rank, then a barrier), then compute with them there
//   for (step...) {
//     ... forward, backward, sync.finish() ...
//     for (i) update shards.owned(i) elements of parameter i with sync.grad(i)
//     shards.all_gather();                       // collective
//   }
//
// Layout: the parameters live in ONE buffer: with shm on one node a single
// copy for all the node's ranks (ProcessGroup::allocate_node_shared), so
// all_gather() has nothing to move; otherwise one per rank from
// ProcessGroup::allocate(); each parameter at a 64-byte aligned offset, in the
// order given; the buffer (padded to a multiple of 64 * world_size bytes) is
// cut into world_size equal slices, and rank r owns the elements of slice r.
// A parameter may be owned in part by several ranks, or not at all by some.
// Pointers from data()/view() stay valid for the object's lifetime.
//
// Live recovery (ddp::Healer): with ShardOptions::replicas each rank also
// updates another rank's slice (replica(); ShardLayout::replica_shift), so every slice of
// the optimizer's state is on two ranks; after a reform, restore() hands
// every member the whole state from the ranks still holding it, and the
// trainer shards again over the new group.
//
// Thread-safety: none; call from the trainer's thread. Errors are ddp::Error.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ddp/grad_sync.h"
#include "ddp/process_group.h"

namespace ddp {

// ElementRange (ddp/types.h): elements [begin, end) of one parameter.

// Pure: where each parameter lives in the flat buffer and which of its
// elements each rank owns.
struct ShardLayout {
  std::vector<std::size_t> offsets;  // bytes, per parameter, 64-byte aligned
  std::vector<std::size_t> element_sizes;
  std::vector<std::size_t> counts;
  std::size_t total_bytes = 0;  // a multiple of 64 * world_size
  std::size_t slice_bytes = 0;  // total_bytes / world_size
  int world_size = 1;

  // The elements of parameter `param` inside rank `rank`'s slice.
  ElementRange owned(std::size_t param, int rank) const;
  // With replicas (ShardOptions): rank r also keeps the slice of rank
  // (r + replica_shift()) % world_size, half the world further on in ring
  // order, so that with nodes of equal size a slice and its replica are on
  // different nodes (on one node: any two ranks but r and r + world/2).
  int replica_shift() const { return world_size < 2 ? 0 : std::max(1, world_size / 2); }
};
// counts[i] elements of element_sizes[i] bytes (each 1, 2, 4 or 8).
// Throws ddp::Error when world_size < 1 or a size is not one of those.
ShardLayout make_shard_layout(const std::vector<std::size_t>& counts,
                              const std::vector<std::size_t>& element_sizes, int world_size);

struct ShardOptions {
  // Each rank also keeps and updates another rank's slice (replica()), and
  // the buffer is one per rank, never node-shared: a rank that dies cannot
  // leave a half-written slice in anyone else's memory.
  bool replicas = false;
};

class ParamShards {
 public:
  // Allocates the flat buffer (zeroed) for `params` (their count() and dtype;
  // device and requires_grad are not used: host memory, and frozen
  // parameters are sharded like the others). Collective (the node-shared
  // buffer's place is handed out by rank 0): every rank constructs it at the
  // same point with the same parameters. `group` must outlive this object's
  // collectives (all_gather); the rest (owned(), replica(), data(), view())
  // may be asked after it is gone, e.g. while a rebuilt group takes over.
  ParamShards(ProcessGroup& group, const std::vector<GradParam>& params, ShardOptions options = {});

  std::size_t num_params() const { return layout_.counts.size(); }
  // Parameter `index`'s values (count() elements of its dtype).
  void* data(std::size_t index);
  // The same, typed: throws unless the parameter is float32.
  float* view(std::size_t index);
  // The elements of parameter `index` this rank updates.
  ElementRange owned(std::size_t index) const;
  // With replicas: the elements of parameter `index` in the slice this rank
  // keeps a replica of and updates too (empty without replicas, or alone).
  ElementRange replica(std::size_t index) const;
  // The buffer is one copy shared by every rank of the node (shm, a group on
  // one node): then a rank must write only its owned() elements (the others
  // are written by their owners at the same time; before the first
  // all_gather(), let one rank fill it, then a barrier), and all_gather() is
  // a barrier.
  bool node_shared() const { return node_shared_; }
  const ShardLayout& layout() const { return layout_; }

  // Collective: every rank's owned elements of every parameter to every rank.
  void all_gather();
  // Collective: the same for other parameter-shaped buffers (an optimizer's
  // per-parameter state, e.g. before rank 0 writes a checkpoint):
  // buffers[i] holds parameter i's count() elements of its dtype, or is null
  // for a parameter without such state (on every rank alike). Each rank's
  // owned elements are copied to everyone through a staging buffer.
  void all_gather(const std::vector<void*>& buffers);

  // Live recovery, after each reform of a heal: every member of `group` gets
  // every element of the parameter-shaped buffers in `sets` (sets[k][i]:
  // parameter i's elements, or null for none; k: the weights, an optimizer
  // state...) as the ranks of the layout `old` held them: old rank s's slice
  // from the member that was rank s, else from the one that kept its replica
  // (old rank s - old.replica_shift(), ring order). held_as[m]: member m's rank in `old` when it
  // holds its slice and replica as they must be restored, -1 when it holds
  // nothing to give (a relaunch). Collective: every member passes the same
  // `old` and `held_as`. Throws HealError naming the old rank whose slice no
  // member holds (it and its replica's keeper both left), ddp::Error for a
  // wrong argument or a failed collective. Returns the bytes the holders
  // sent (each member received them).
  static std::uint64_t restore(ProcessGroup& group, const ShardLayout& old,
                               const std::vector<int>& held_as,
                               const std::vector<std::vector<void*>>& sets);

 private:
  void check_index(std::size_t index) const;

  ProcessGroup* group_;
  int rank_ = 0;  // this rank in group_ (layout_.world_size ranks)
  std::vector<DType> dtypes_;
  ShardLayout layout_;
  std::shared_ptr<void> buffer_;
  bool node_shared_ = false;
  bool replicas_ = false;
};

}  // namespace ddp
