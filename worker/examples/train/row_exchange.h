#pragma once
// The activation exchange (train --exchange activations), for the ranks of one
// node: instead of every rank computing the whole weight gradient of its own
// batch and all-reducing it (12.6 MB per step for the benchmark's MLP), each
// rank computes only ITS rows of every layer's weight gradient, from every
// rank's layer inputs and output gradients, which the ranks leave side by side
// in memory they all map (0.5 MB per layer). dW[rows] = dZ_all[:, rows]^T X_all
// sums over the global batch exactly what the all-reduce would have summed
// (the same floating-point terms, added in a different order). Each rank then
// updates its rows of the one node-wide copy of the weights. Same FLOPs per
// rank, far less memory traffic between the cores, and the optimizer's work
// and state are divided by the world size (as with ZeRO).
//
// This header is the pure part: who owns which rows, and where the rows of
// every rank are.

#include <cstddef>
#include <functional>
#include <vector>

#include "ddp/types.h"

namespace train {

// Rows [begin, end) of a matrix.
struct RowRange {
  int begin = 0;
  int end = 0;
  int size() const { return end - begin; }
  bool empty() const { return end <= begin; }
};

// The rows of a `rows`-row parameter that rank `rank` of `world` owns: world
// contiguous ranges in rank order, sizes differing by at most one, covering
// every row once (a rank owns none when rows < world). Throws ddp::Error when
// world < 1, rank is outside [0, world) or rows < 0.
RowRange owned_rows(int rows, int world, int rank);

// The elements of parameter `param` (numbered like Mlp's: layer l's weight
// 2l, [dims[l+1] x dims[l]] row-major, its bias 2l+1) in rank `rank`'s
// owned_rows() of its layer: what that rank's optimizer updates.
ddp::ElementRange owned_elements(const std::vector<int>& dims, std::size_t param, int world,
                                 int rank);

// Where the exchanged rows are, for a model with layer sizes dims (L layers).
// inputs[l] (l < L): layer l's input, world * batch rows of dims[l] floats;
// grads[l]: dLoss/d(layer l's pre-activation output), world * batch rows of
// dims[l+1]; rank r's rows start at row r * batch of each. Every rank sees the
// same memory (on one rank, private memory). wait_for_all is a barrier of
// those ranks: after it, every rank's writes before it are visible.
struct ExchangeBlocks {
  int world = 1;
  int rank = 0;
  int batch = 0;  // rows per rank: every rank's micro-batch has this size
  std::vector<float*> inputs, grads;
  std::function<void()> wait_for_all;

  float* my_input(int layer, int width) const { return inputs[layer] + mine(width); }
  float* my_grad(int layer, int width) const { return grads[layer] + mine(width); }

 private:
  long mine(int width) const { return static_cast<long>(rank) * batch * width; }
};

}  // namespace train
