#pragma once
// --shard_optimizer under --on_failure=heal (the CPU engine): the optimizer
// is sharded as ZeRO stage 1 (ddp::ParamShards), and each rank also updates
// the shard of the rank half the world further on (a replica; on another
// node when nodes are of equal size), so the loss of any one rank, or of a
// whole node, loses no optimizer state. Before each
// update a rank copies what it is about to change, so a step that no member
// finished can be taken back.
//
// Per reform, collectively over the new group: restore() brings every member
// to the most advanced committed step holding the whole state (weights and
// optimizer), then shard() cuts it again over the new group. Not
// thread-safe; the trainer's thread only.

#include <cstdint>
#include <memory>
#include <vector>

#include "ddp/param_shards.h"
#include "mlp.h"
#include "optimizer.h"

namespace train {

class HealingShards {
 public:
  // `model` and `optimizer` outlive this object. Starts whole and unsharded.
  HealingShards(Mlp& model, Optimizer& optimizer) : model_(model), opt_(optimizer) {}

  // Collective: shards over `group`; the weights move into the shards' buffer.
  void shard(ddp::ProcessGroup& group);
  // One optimizer step with the averaged gradients (whole on every rank):
  // this rank's shard and its replica, then every rank's shard to everyone.
  void step(ddp::GradAverager& sync);
  // Collective, for a checkpoint: every rank's optimizer shard to everyone.
  void gather();
  // Collective, before every state sync of a heal (HealParticipant::before_sync):
  // every member that committed the most steps of any member ends holding the
  // whole state at that step (the others get it from the sync). A member
  // that updated its shard for a step no member finished takes the update
  // back. `committed`: this member's committed steps (-1: a relaunch, holding
  // nothing). Returns the bytes the holders sent (0: nothing moved). Throws
  // ddp::HealError when a shard and its replica were both lost.
  std::uint64_t restore(ddp::ProcessGroup& group, std::int64_t committed);
  // Every weight and every element of the optimizer's state is current here.
  bool whole() const { return whole_; }

 private:
  // The weights, then each optimizer state buffer, by parameter.
  std::vector<std::vector<void*>> buffer_sets();
  template <typename Fn>
  void for_each_kept(Fn&& fn);
  void back_up();
  void take_back();

  Mlp& model_;
  Optimizer& opt_;
  std::unique_ptr<ddp::ParamShards> shards_;
  int held_rank_ = -1, held_world_ = 0;  // the layout shards_ was cut for
  bool whole_ = true;                    // after a gather or a restore, until the next update
  bool updated_ = false;                 // this step's update applied, its gather not finished
  std::vector<float> backup_;            // the kept elements as they were before the update
  std::int64_t backup_steps_ = 0;
};

}  // namespace train
