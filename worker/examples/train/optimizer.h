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
#include <memory>
#include <vector>

#include "ddp/params.h"
#include "flags.h"

namespace train {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Starts an optimizer step (Adam's bias correction counts them).
  void begin_step() { ++steps_; }
  // Applies this step's update to parameter `param` (count(param) elements).
  virtual void update(std::size_t param, float* data, const float* grad) = 0;
  // The state: the step count (1 int64) first, then the float buffers in
  // parameter order. The pointers stay valid for the optimizer's lifetime.
  virtual std::vector<ddp::ParamBuffer> state() = 0;
  std::int64_t steps() const { return steps_; }

 protected:
  std::int64_t steps_ = 0;
};

// counts[i]: parameter i's element count.
std::unique_ptr<Optimizer> make_optimizer(const Config& config,
                                          const std::vector<std::size_t>& counts);

}  // namespace train
