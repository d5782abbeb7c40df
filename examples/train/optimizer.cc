#include "optimizer.h"

#include <cmath>

namespace train {

namespace {

int state_groups(const Config& c) {
  return c.optimizer == OptimizerKind::kAdam ? 2 : static_cast<float>(c.momentum) != 0.0f ? 1 : 0;
}

}  // namespace

std::size_t Optimizer::state_floats(const Config& c, const std::vector<std::size_t>& counts) {
  std::size_t per_group = 0;
  for (std::size_t n : counts) per_group += n;
  return per_group * static_cast<std::size_t>(state_groups(c));
}

Optimizer::Optimizer(const Config& c, std::vector<std::size_t> counts, float* storage)
    : kind_(c.optimizer),
      lr_(static_cast<float>(c.lr)),
      momentum_(static_cast<float>(c.momentum)),
      beta1_(static_cast<float>(c.beta1)),
      beta2_(static_cast<float>(c.beta2)),
      eps_(static_cast<float>(c.eps)),
      counts_(std::move(counts)) {
  if (!storage) {
    own_.assign(state_floats(c, counts_), 0.0f);
    storage = own_.data();
  }
  for (int g = 0; g < state_groups(c); ++g) {
    state_.emplace_back();
    for (std::size_t n : counts_) {
      state_.back().push_back(storage);
      storage += n;
    }
  }
}

void Optimizer::update_range(std::size_t param, float* data, const float* grad, std::size_t begin,
                             std::size_t end) {
  // restrict: the arrays never overlap, which lets the loops vectorize.
  float* __restrict p = data + begin;
  const float* __restrict g = grad + begin;
  const std::size_t n = end - begin;
  if (kind_ == OptimizerKind::kSgd) {
    // p -= lr * buf, buf = momentum * buf + g (torch.optim.SGD, dampening 0). The
    // buffer starts at zero, so the first step's buf is g, as in torch.
    const float lr = lr_, mu = momentum_;
    if (state_.empty()) {
      for (std::size_t k = 0; k < n; ++k) p[k] -= lr * g[k];
      return;
    }
    float* __restrict buf = state_[0][param] + begin;
    for (std::size_t k = 0; k < n; ++k) {
      buf[k] = mu * buf[k] + g[k];
      p[k] -= lr * buf[k];
    }
    return;
  }
  // torch.optim.Adam: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
  // p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
  const double t = static_cast<double>(steps_);
  const auto step_size = static_cast<float>(lr_ / (1.0 - std::pow(double{beta1_}, t)));
  const auto inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(double{beta2_}, t)));
  const float b1 = beta1_, b2 = beta2_, eps = eps_;
  float* __restrict m = state_[0][param] + begin;
  float* __restrict v = state_[1][param] + begin;
  for (std::size_t k = 0; k < n; ++k) {
    m[k] = b1 * m[k] + (1.0f - b1) * g[k];
    v[k] = b2 * v[k] + (1.0f - b2) * g[k] * g[k];
    p[k] -= step_size * m[k] / (std::sqrt(v[k]) * inv_bc2_sqrt + eps);
  }
}

std::vector<std::vector<void*>> Optimizer::param_shaped_state() {
  std::vector<std::vector<void*>> out;
  for (auto& group : state_) {
    out.emplace_back();
    for (float* buffer : group) out.back().push_back(buffer);
  }
  return out;
}

std::vector<ddp::ParamBuffer> Optimizer::state() {
  std::vector<ddp::ParamBuffer> out{{&steps_, 1, ddp::DType::kInt64}};
  for (std::size_t p = 0; p < counts_.size(); ++p) {
    for (auto& group : state_) out.push_back({group[p], counts_[p], ddp::DType::kFloat32});
  }
  return out;
}

}  // namespace train
