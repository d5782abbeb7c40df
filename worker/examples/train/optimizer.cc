#include "optimizer.h"

#include <cmath>
#include <cstring>
#include <string>

#include "ddp/common/error.h"

namespace train {
namespace {

// p -= lr * buf, buf = momentum * buf + g (torch.optim.SGD, dampening 0). The
// buffer starts at zero, so the first step's buf is g, as in torch.
class Sgd final : public Optimizer {
 public:
  Sgd(float lr, float momentum, const std::vector<std::size_t>& counts)
      : Optimizer(counts), lr_(lr), momentum_(momentum) {
    if (momentum_ != 0.0f) add_state_group();
  }

  void update_elements(std::size_t param, float* p_, const float* g_, std::size_t begin,
                       std::size_t end) override {
    // restrict: the three arrays never overlap, which lets the loops vectorize.
    float* __restrict p = p_ + begin;
    const float* __restrict g = g_;
    const std::size_t n = end - begin;
    const float lr = lr_, mu = momentum_;
    if (state_groups() == 0) {
      for (std::size_t k = 0; k < n; ++k) p[k] -= lr * g[k];
      return;
    }
    float* __restrict buf = buffer(0, param) + begin;
    for (std::size_t k = 0; k < n; ++k) {
      buf[k] = mu * buf[k] + g[k];
      p[k] -= lr * buf[k];
    }
  }

 private:
  float lr_, momentum_;
};

// torch.optim.Adam: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
class Adam final : public Optimizer {
 public:
  Adam(float lr, float beta1, float beta2, float eps, const std::vector<std::size_t>& counts)
      : Optimizer(counts), lr_(lr), beta1_(beta1), beta2_(beta2), eps_(eps) {
    add_state_group();  // m
    add_state_group();  // v
  }

  void update_elements(std::size_t param, float* p_, const float* g_, std::size_t begin,
                       std::size_t end) override {
    float* __restrict p = p_ + begin;
    const float* __restrict g = g_;
    const std::size_t n = end - begin;
    const double t = static_cast<double>(steps_);
    const auto step_size = static_cast<float>(lr_ / (1.0 - std::pow(beta1_, t)));
    const auto inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(beta2_, t)));
    const float b1 = beta1_, b2 = beta2_, eps = eps_;
    float* __restrict m = buffer(0, param) + begin;
    float* __restrict v = buffer(1, param) + begin;
    for (std::size_t k = 0; k < n; ++k) {
      m[k] = b1 * m[k] + (1.0f - b1) * g[k];
      v[k] = b2 * v[k] + (1.0f - b2) * g[k] * g[k];
      p[k] -= step_size * m[k] / (std::sqrt(v[k]) * inv_bc2_sqrt + eps);
    }
  }

 private:
  double lr_, beta1_, beta2_;
  float eps_;
};

}  // namespace

void Optimizer::add_state_group() {
  own_.emplace_back();
  state_.emplace_back();
  for (std::size_t n : counts_) {
    own_.back().emplace_back(n, 0.0f);
    state_.back().push_back(own_.back().back().data());
  }
}

std::vector<std::vector<void*>> Optimizer::param_shaped_state() {
  std::vector<std::vector<void*>> out;
  for (const auto& group : state_) out.emplace_back(group.begin(), group.end());
  return out;
}

std::vector<ddp::ParamBuffer> Optimizer::state() {
  std::vector<ddp::ParamBuffer> out{{&steps_, 1, ddp::DType::kInt64}};
  for (std::size_t p = 0; p < counts_.size(); ++p) {
    for (const auto& group : state_) out.push_back({group[p], counts_[p], ddp::DType::kFloat32});
  }
  return out;
}

void Optimizer::bind_state(const std::vector<std::vector<float*>>& storage, bool copy) {
  if (storage.size() != state_.size()) {
    throw ddp::Error("Optimizer::bind_state: " + std::to_string(storage.size()) +
                     " groups of buffers for " + std::to_string(state_.size()));
  }
  for (std::size_t g = 0; g < storage.size(); ++g) {
    if (storage[g].size() != counts_.size()) {
      throw ddp::Error("Optimizer::bind_state: group " + std::to_string(g) + " has " +
                       std::to_string(storage[g].size()) + " buffers for " +
                       std::to_string(counts_.size()) + " parameters");
    }
  }
  for (std::size_t g = 0; g < storage.size(); ++g) {
    for (std::size_t p = 0; p < counts_.size(); ++p) {
      if (copy && storage[g][p] != state_[g][p])
        std::memcpy(storage[g][p], state_[g][p], counts_[p] * sizeof(float));
      state_[g][p] = storage[g][p];
    }
  }
  own_.clear();
}

std::unique_ptr<Optimizer> make_optimizer(const Config& c, const std::vector<std::size_t>& counts) {
  if (c.optimizer == OptimizerKind::kAdam) {
    return std::make_unique<Adam>(static_cast<float>(c.lr), static_cast<float>(c.beta1),
                                  static_cast<float>(c.beta2), static_cast<float>(c.eps), counts);
  }
  return std::make_unique<Sgd>(static_cast<float>(c.lr), static_cast<float>(c.momentum), counts);
}

}  // namespace train
