#pragma once
// The shm backend (internal to libddp): collectives among the ranks of one
// node through a shared segment (segment.h) at memory speed; hierarchical
// all-reduce across nodes (Gloo between ranks of the same local rank); Gloo
// for everything else.
//
// The backend owns the node's state and hands it to the collectives: a
// Context (context.h: segment, phase sync, deadline, parities) that the
// collectives' free functions run over (variants.h; one file each), a Tuner
// (tuner.h) that decides which variant each call runs, and this rank's arena
// pages (arena_pages.h) for allocate() and the tuner's scratch. This file's
// .cc holds setup, the guard every collective runs in, and allocation;
// node_setup.cc how the node's ranks meet at the segment.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/shm/arena_pages.h"
#include "backends/shm/carried_arena.h"
#include "backends/shm/context.h"
#include "backends/shm/tuner.h"
#include "backends/shm/variants.h"
#include "core/backend.h"
#include "ddp/common/error.h"

namespace ddp::shm_backend {

using Clock = std::chrono::steady_clock;
using shm::Algorithm;
using shm::Collective;

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

  // Each collective: within the node over the segment (variants.h), Gloo
  // where the shm backend has no way (across nodes, a node of one rank).
  void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) override {
    reduce_everywhere(data, count, dtype, op, nullptr);
  }
  void all_reduce_partial(void* data, std::size_t count, DType dtype, ReduceOp op,
                          const std::vector<ElementRange>& needed) override {
    reduce_everywhere(data, count, dtype, op, &needed);
  }
  void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) override {
    guarded([&] {
      if (count == 0) return;
      if (!single_node()) return fallback().reduce(data, count, dtype, op, root);
      shm::reduce(ctx_, data, count, dtype, op, root);
    });
  }
  void broadcast(void* data, std::size_t count, DType dtype, int root) override {
    guarded([&] {
      if (count == 0) return;
      if (!single_node()) return fallback().broadcast(data, count, dtype, root);
      const Algorithm a =
          variant_for(Collective::kBroadcast, count * dtype_size(dtype), dtype, -1, root);
      shm::broadcast(ctx_, a, data, count, dtype, root, false);
    });
  }
  void all_gather(const void* in, void* out, std::size_t count, DType dtype) override {
    guarded([&] {
      if (count == 0) return;
      if (!single_node()) return fallback().all_gather(in, out, count, dtype);
      const Algorithm a =
          variant_for(Collective::kAllGather, count * dtype_size(dtype), dtype, -1, -1);
      shm::all_gather(ctx_, a, in, out, count, dtype, false);
    });
  }
  // Rank r's `out` = block r of every rank's `in`, reduced.
  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype,
                      ReduceOp op) override {
    guarded([&] {
      if (count == 0) return;
      if (!single_node()) return fallback().reduce_scatter(in, out, count, dtype, op);
      const Algorithm a = variant_for(Collective::kReduceScatter, count * dtype_size(dtype), dtype,
                                      static_cast<std::int32_t>(op), -1);
      shm::reduce_scatter(ctx_, a, in, out, count, dtype, op, false);
    });
  }
  void barrier() override {
    guarded([&] {
      if (!single_node()) return fallback().barrier();
      ctx_.begin(
          ctx_.descriptor(Collective::kBarrier, DType::kUInt8, 0, -1, -1, Algorithm::kAuto, false));
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
    if (ctx_.sync) ctx_.sync->leave();
    if (cross_) cross_->abort();
    if (fallback_) fallback_->abort();
  }

 private:
  bool single_node() const { return state_ && config_.nodes == 1; }

  // Runs one collective: refused once an earlier one failed (the ranks may
  // now be in different phases), and bounded by the group's timeout.
  template <class Body>
  void guarded(Body&& body) {
    if (!broken_.empty())
      throw Error("shm: this group is unusable after an earlier failure: " + broken_);
    ctx_.deadline = Clock::now() + timeout_;
    try {
      body();
    } catch (const std::exception& e) {
      broken_ = e.what();
      throw;
    }
  }

  // all_reduce, and all_reduce_partial with the ranges this rank `needed`.
  void reduce_everywhere(void* data, std::size_t count, DType dtype, ReduceOp op,
                         const std::vector<ElementRange>* needed) {
    guarded([&] {
      if (count == 0) return;
      if (!state_ || (config_.nodes > 1 && !cross_)) {
        // One rank on this node (across nodes: Gloo among them), or nodes of different sizes.
        return state_ ? fallback().all_reduce(data, count, dtype, op)
                      : across().all_reduce(data, count, dtype, op);
      }
      const Algorithm a = variant_for(Collective::kAllReduce, count * dtype_size(dtype), dtype,
                                      static_cast<std::int32_t>(op), -1);
      shm::all_reduce(ctx_, a, data, count, dtype, op, needed, false);
    });
  }

  // The variant this call of `c` runs (the tuner's choice, timing the
  // candidates on scratch from this rank's arena when it must).
  Algorithm variant_for(Collective c, std::size_t bytes, DType dtype, std::int32_t op, int root);

  shm::ArenaView my_arena() const;

  // Makes (local rank 0) or attaches to the node's segment, agrees on the
  // node's algorithm choices and sets up the phase sync.
  void open_segment();

  // Gloo over the whole group, created on first use (every rank reaches the
  // same collective, so every rank creates it there).
  Backend& fallback();
  // Gloo among the nodes when this node has one rank, else the whole group.
  Backend& across() { return cross_ ? *cross_ : fallback(); }

  BackendConfig config_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds connect_;   // creation's waits for peers (connect_timeout)
  std::shared_ptr<SharedState> state_;  // null when this rank is alone on its node
  // Alone on its node under shm_carry_arena: the carried arena allocate() takes from.
  std::shared_ptr<shm::LoneArena> lone_;
  std::unique_ptr<Backend> cross_;     // Gloo among the ranks of this local rank on every node
  std::unique_ptr<Backend> fallback_;  // Gloo among all ranks
  // Declared after what it points into (state_'s segment, cross_), so it goes first.
  shm::Context ctx_;  // what the collectives share
  shm::Tuner tuner_;  // which variant each call runs
  std::string broken_;
  std::atomic<bool> warned_{false};  // allocate() may be called from any thread
};

}  // namespace ddp::shm_backend
