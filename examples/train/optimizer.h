#pragma once
// The optimizers, with torch.optim's update rules (so runs compare with a
// PyTorch script): SGD with momentum (no dampening, no Nesterov) and Adam
// (bias-corrected, eps outside the square root).
//
// Their whole state — the step count and the per-parameter buffers (momentum,
// or Adam's two moments) — is exposed as ParamBuffers, so that a checkpoint
// can save and load it and rank 0 can broadcast it on resume, as it does the
// weights.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ddp/params.h"
#include "flags.h"

namespace train {

class Optimizer {
 public:
  // counts[i]: parameter i's element count. `storage`: state_floats(config,
  // counts) zeroed floats that hold the per-parameter buffers (owned by the
  // caller, outliving the optimizer), else the optimizer allocates its own.
  Optimizer(const Config& config, std::vector<std::size_t> counts, float* storage = nullptr);
  // How many floats of per-parameter state an optimizer of `config` keeps.
  static std::size_t state_floats(const Config& config, const std::vector<std::size_t>& counts);
  // Starts an optimizer step (Adam's bias correction counts them).
  void begin_step() { ++steps_; }
  // Applies this step's update to elements [begin, end) of parameter `param`
  // (data and grad point at its first element; the other elements' state is
  // left as it is: a ddp::ParamShards shard).
  void update_range(std::size_t param, float* data, const float* grad, std::size_t begin,
                    std::size_t end);
  void update(std::size_t param, float* data, const float* grad) {
    update_range(param, data, grad, 0, counts_[param]);
  }
  // The state shaped like the parameters, in groups of one float buffer per
  // parameter (SGD with momentum: one group; Adam: m, then v; plain SGD: none).
  std::vector<std::vector<void*>> param_shaped_state();
  // The state: the step count (1 int64) first, then the float buffers in
  // parameter order (each parameter's groups in order).
  std::vector<ddp::ParamBuffer> state();

 private:
  OptimizerKind kind_;
  float lr_, momentum_, beta1_, beta2_, eps_;
  std::vector<std::size_t> counts_;
  std::int64_t steps_ = 0;
  std::vector<float> own_;                  // the buffers' storage when the caller gave none
  std::vector<std::vector<float*>> state_;  // [group][param]: where each buffer is
};

}  // namespace train
