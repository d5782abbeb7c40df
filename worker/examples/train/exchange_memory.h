#pragma once
// The I/O half of the activation exchange (row_exchange.h): the memory every
// rank of the node maps, and the waits between the ranks.
//
// Thread-safety: none; the trainer's thread only (wait_for_all is a
// collective of the group, like every call on it).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ddp/process_group.h"
#include "row_exchange.h"

namespace train {

// What a trainer reports about the exchange.
struct ExchangeStats {
  std::int64_t backwards = 0;          // backward passes (micro-batches)
  double backward_ms = 0;              // their mean time (with the units' updates), waits included
  double waited_ms = 0;                // mean time per backward pass waiting for the other ranks
  std::size_t bytes_per_backward = 0;  // ExchangeMemory::exchanged_bytes()
  int units = 0;                       // weight-gradient units per backward pass (all ranks)
  double units_taken = 0;              // how many of them this rank took, on average
};

class ExchangeMemory {
 public:
  // Collective. For the ranks of `group`, which must all be on one node with
  // the shm backend (or be a world of one): one node-wide block holding the
  // parameters, their gradients and `state_groups` buffers of optimizer state
  // (param_counts[p] floats each, 64-byte aligned, zeroed), the exchange
  // blocks of a model with layer sizes `dims` for `batch` rows per rank, and
  // the blocks' control words. Throws ddp::Error, on every rank alike, when
  // the ranks cannot share memory (another backend, several nodes, no room in
  // the segment). `group` must outlive this object.
  ExchangeMemory(ddp::ProcessGroup& group, const std::vector<std::size_t>& param_counts,
                 std::size_t state_groups, const std::vector<int>& dims, int batch);
  // blocks()'s waits point at this object.
  ExchangeMemory(const ExchangeMemory&) = delete;
  ExchangeMemory& operator=(const ExchangeMemory&) = delete;

  // Where parameter p's values, its gradient and its optimizer state (group
  // g) live: the same memory on every rank.
  const std::vector<float*>& params() const { return params_; }
  const std::vector<float*>& grads() const { return grads_; }
  const std::vector<std::vector<float*>>& state() const { return state_; }
  // Bind to the model (Mlp::bind_exchange). Its wait_for_all is the group's
  // barrier and its wait_for_published spins, then yields, up to the group's
  // timeout (a rank that died or hangs is named, never a hang); both timed
  // into waited_ms().
  const ExchangeBlocks& blocks() const { return blocks_; }
  // Milliseconds spent in the blocks' waits since construction.
  double waited_ms() const { return waited_ms_; }
  // Bytes every rank writes into the blocks per micro-batch (inputs and
  // output gradients of every layer), all ranks together.
  std::size_t exchanged_bytes() const { return exchanged_bytes_; }
  bool shared() const { return shared_; }

 private:
  void wait_for_published(std::int64_t count);

  ddp::ProcessGroup& group_;
  std::shared_ptr<void> memory_;
  std::vector<float*> params_, grads_;
  std::vector<std::vector<float*>> state_;
  ExchangeBlocks blocks_;
  double waited_ms_ = 0;
  std::size_t exchanged_bytes_ = 0;
  bool shared_ = false;
};

}  // namespace train
