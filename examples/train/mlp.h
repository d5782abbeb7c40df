#pragma once
// The model: a multi-layer perceptron, Linear -> ReLU -> ... -> Linear, with
// forward and backward on the CPU through OpenBLAS (row-major sgemm).
//
// Parameters are numbered like torch's named_parameters(): layer l's weight
// [out x in] is index 2l ("fc{l+1}.weight"), its bias [out] index 2l+1
// ("fc{l+1}.bias"). The backward pass visits layers last to first and writes
// each gradient straight into ddp::GradSync's view of it, marking it ready
// at once (bias, then weight), before the gradient flows on to the layer
// below: a bucket's all-reduce starts while the lower layers are still being
// differentiated.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ddp/grad_averager.h"

namespace train {

class Mlp {
 public:
  // dims = {input, hidden..., output}: at least two entries, each >= 1 (the
  // flags are checked so). Weights and biases start uniform in
  // +-1/sqrt(fan_in), as torch's nn.Linear does, drawn from `seed`; zero
  // when `draw` is false (a model whose values are about to be received).
  // `storage`: param_floats(dims) zeroed floats that hold the parameters
  // (owned by the caller, outliving the model, e.g. ddp::Healer's state
  // memory), else the model allocates its own.
  Mlp(std::vector<int> dims, std::uint64_t seed, bool draw = true, float* storage = nullptr);
  // The element count of each parameter tensor of a model of `dims`, and their sum.
  static std::vector<std::size_t> param_counts(const std::vector<int>& dims);
  static std::size_t param_floats(const std::vector<int>& dims);

  int num_layers() const { return static_cast<int>(dims_.size()) - 1; }
  const std::vector<int>& dims() const { return dims_; }

  // Parameter tensors (2 per layer) and their element counts.
  std::size_t num_tensors() const { return counts_.size(); }
  std::size_t count(std::size_t param) const { return counts_[param]; }
  float* data(std::size_t param) { return data_[param]; }
  // Moves the parameters into storage[p] (count(p) floats each, owned by the
  // caller and outliving the model: ddp::ParamShards' views): the current
  // values are copied there (unless `copy` is false: another rank fills
  // memory that several ranks share) and every later use reads them there.
  void bind(const std::vector<float*>& storage, bool copy = true);
  // Names and shapes, for GradSync (and its cross-rank check).
  std::vector<ddp::GradParam> grad_params() const;

  // Runs the model on `batch` rows of `x` (batch x input_dim). Returns the
  // outputs (batch x output_dim), valid until the next forward. `x` must stay
  // unchanged until backward() returns. `peers` (may be null): asked
  // check_peers() between the pieces (16 MiB of weights each) of a larger
  // layer, so that a step a dead peer voided ends early with that ddp::Error.
  float* forward(const float* x, int batch, ddp::ProcessGroup* peers = nullptr);
  // The buffer (batch x output_dim) the loss writes dLoss/dOutputs into;
  // call it after forward(), which sizes it (before the first, it is null).
  float* output_grad() { return dz_.data(); }
  // Back-propagates output_grad() through the last forward, between
  // sync.begin_backward() and sync.finish(). Each gradient, scale *
  // dLoss/dParam, goes to sync.contribute(), stored or added block by block
  // as each block says (the first micro-step of an accumulation window
  // stores, later ones add). Before each layer below the output layer it
  // asks sync.group().check_peers(), and so between the pieces of a large
  // layer's work as forward() does: once a peer is known gone the step cannot
  // commit, and the pass ends there with that ddp::Error (the caller drops
  // the averager, or calls finish(), which then throws too).
  void backward(ddp::GradAverager& sync, float scale);

 private:
  std::vector<int> dims_;
  std::vector<std::size_t> counts_;
  std::vector<float> own_;    // the parameters' storage when the caller gave none
  std::vector<float*> data_;  // where each parameter's values are
  int batch_ = 0;
  const float* x_ = nullptr;
  std::vector<std::vector<float>> act_;  // act_[l]: output of layer l (post-ReLU for hidden)
  std::vector<float> dz_, dz_next_, ones_;
};

}  // namespace train
