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
#include <utility>
#include <vector>

#include "ddp/params.h"
#include "flags.h"

namespace train {

class Optimizer {
 public:
  explicit Optimizer(std::vector<std::size_t> counts) : counts_(std::move(counts)) {}
  virtual ~Optimizer() = default;
  // Starts an optimizer step (Adam's bias correction counts them).
  void begin_step() { ++steps_; }
  // Applies this step's update to parameter `param` (count(param) elements).
  void update(std::size_t param, float* data, const float* grad) {
    update_range(param, data, grad, 0, counts_[param]);
  }
  // The same for elements [begin, end) only (a shard, ddp::ParamShards):
  // data and grad point at the parameter's first element; the state of the
  // other elements is left as it is.
  void update_range(std::size_t param, float* data, const float* grad, std::size_t begin,
                    std::size_t end) {
    update_elements(param, data, grad + begin, begin, end);
  }
  // The same with the gradient of exactly those elements: grad_of_range[k] is
  // element begin + k's (the activation exchange's gradient rows, computed
  // into a small buffer of their own).
  virtual void update_elements(std::size_t param, float* data, const float* grad_of_range,
                               std::size_t begin, std::size_t end) = 0;
  // The state shaped like the parameters, in groups of one float buffer per
  // parameter (SGD with momentum: one group; Adam: m, then v; plain SGD: none).
  std::vector<std::vector<void*>> param_shaped_state();
  // The state: the step count (1 int64) first, then the float buffers in
  // parameter order (each parameter's groups in order). The pointers stay
  // valid until bind_state().
  std::vector<ddp::ParamBuffer> state();
  // How many groups param_shaped_state() has.
  std::size_t state_groups() const { return state_.size(); }
  // Moves the param-shaped state into storage[g][p] (count(p) floats each,
  // owned by the caller and outliving the optimizer, e.g. memory every rank
  // of a node maps): the current values are copied there (unless `copy` is
  // false: another rank fills memory that several ranks share), and every
  // later update uses them there. Throws ddp::Error when the shape differs.
  void bind_state(const std::vector<std::vector<float*>>& storage, bool copy = true);
  std::int64_t steps() const { return steps_; }

 protected:
  // Adds a zeroed group of buffers shaped like the parameters.
  void add_state_group();
  // Group g's buffer of parameter p.
  float* buffer(std::size_t group, std::size_t param) { return state_[group][param]; }

  std::vector<std::size_t> counts_;
  std::int64_t steps_ = 0;

 private:
  std::vector<std::vector<float*>> state_;           // [group][param]: where it lives
  std::vector<std::vector<std::vector<float>>> own_;  // its own storage, until bind_state()
};

// counts[i]: parameter i's element count.
std::unique_ptr<Optimizer> make_optimizer(const Config& config,
                                          const std::vector<std::size_t>& counts);

}  // namespace train
