#pragma once
// The activation exchange (train --exchange activations), for the ranks of one
// node: instead of every rank computing the whole weight gradient of its own
// batch and all-reducing it (12.6 MB per step for the benchmark's MLP), the
// ranks leave every layer's inputs and output gradients side by side in memory
// they all map (0.5 MB per layer), and the weight gradient is cut into units
// of rows: dW[rows] = dZ_all[:, rows]^T X_all sums over the global batch
// exactly what the all-reduce would have summed (the same floating-point
// terms, added in a different order). Whichever rank is free claims the next
// unit, computes it and updates those rows of the node's one copy of the
// weights and optimizer state. Same FLOPs in all, no gradient moves, and a
// rank slowed by its core hands its share of the units to the others.
//
// This header is the pure part: the units, the order data becomes ready in,
// and the claiming of units.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace train {

// Rows [begin, end) of a matrix.
struct RowRange {
  int begin = 0;
  int end = 0;
  int size() const { return end - begin; }
  bool empty() const { return end <= begin; }
};

// Rows `rows` of layer `layer`'s weight ([dims[l+1] x dims[l]]) and bias.
struct ExchangeUnit {
  int layer = 0;
  RowRange rows;
};

// The units of one micro-batch for `world` ranks: the last layer's first (its
// gradients are ready first), then down to layer 0, each layer's rows in
// order. Guided self-scheduling: each unit holds 1/(2 world) of the work
// still left after it starts (a row of layer l costs dims[l]), but at least
// min_rows rows (fewer only where a layer ends), so the first units are large
// and the last ones small. Every row of every layer is in exactly one unit.
// Throws ddp::Error when dims has fewer than two sizes, a size is below 1,
// world < 1 or min_rows < 1.
std::vector<ExchangeUnit> exchange_units(const std::vector<int>& dims, int world, int min_rows);

// A rank publishes `layers` times per micro-batch: once when its last layer's
// output gradient is written (after its forward pass, whose inputs of every
// layer are written by then), then once per step of its backward chain, which
// writes layer l-1's output gradient reading layer l's weights (l = layers-1
// down to 1). How many of a micro-batch's publishes every rank must have made
// before a unit of `layer` can be computed (update false), or computed and its
// rows of the weights updated (true: every rank has also finished reading
// that layer's weights). Throws ddp::Error when layer is outside [0, layers).
int publishes_needed(int layers, int layer, bool update);

// Hands out a micro-batch's units across ranks: tickets [first, first + count)
// are drawn from one counter every rank sees (`counter`, in memory they all
// map; micro-batch m's first ticket is m * count, so the counter never goes
// back), each ticket exactly once. Returns the unit index drawn, or nothing
// when every unit of this micro-batch is taken. Thread- and process-safe.
std::optional<int> claim_unit(std::int64_t* counter, std::int64_t first, int count);

// Where the exchanged rows are, for a model with layer sizes dims (L layers).
// inputs[l] (l < L): layer l's input, world * batch rows of dims[l] floats;
// grads[l]: dLoss/d(layer l's pre-activation output), world * batch rows of
// dims[l+1]; rank r's rows start at row r * batch of each. Every rank sees the
// same memory (on one rank, private memory).
struct ExchangeBlocks {
  int world = 1;
  int rank = 0;
  int batch = 0;  // rows per rank: every rank's micro-batch has this size
  std::vector<float*> inputs, grads;
  // The control words, in the same memory: *published(r) counts rank r's
  // publishes since the start; next_ticket is claim_unit's counter.
  std::int64_t* published_counts = nullptr;  // rank r's at published_counts[r * kStride]
  std::int64_t* next_ticket = nullptr;
  static constexpr int kStride = 8;  // one 64-byte line per rank
  // Blocks until every rank has published at least `count` times (a timeout
  // is an error naming the ranks behind).
  std::function<void(std::int64_t count)> wait_for_published;
  // A barrier of the ranks: after it, every rank's writes before it are visible.
  std::function<void()> wait_for_all;

  float* my_input(int layer, int width) const { return inputs[layer] + mine(width); }
  float* my_grad(int layer, int width) const { return grads[layer] + mine(width); }
  std::int64_t* published(int r) const { return published_counts + r * kStride; }
  // This rank's count is now `count`, and its rows written before are visible.
  void publish(std::int64_t count) const {
    std::atomic_ref<std::int64_t>(*published(rank)).store(count, std::memory_order_release);
  }

 private:
  long mine(int width) const { return static_cast<long>(rank) * batch * width; }
};

}  // namespace train
