#include "optimizer.h"

#include <cmath>

namespace train {
namespace {

// p -= lr * buf, buf = momentum * buf + g (torch.optim.SGD, dampening 0). The
// buffer starts at zero, so the first step's buf is g, as in torch.
class Sgd final : public Optimizer {
 public:
  Sgd(float lr, float momentum, const std::vector<std::size_t>& counts)
      : Optimizer(counts), lr_(lr), momentum_(momentum) {
    if (momentum_ != 0.0f) {
      for (std::size_t n : counts) buffers_.emplace_back(n, 0.0f);
    }
  }

  void update_range(std::size_t param, float* p_, const float* g_, std::size_t begin,
                    std::size_t end) override {
    // restrict: the three arrays never overlap, which lets the loops vectorize.
    float* __restrict p = p_ + begin;
    const float* __restrict g = g_ + begin;
    const std::size_t n = end - begin;
    const float lr = lr_, mu = momentum_;
    if (buffers_.empty()) {
      for (std::size_t k = 0; k < n; ++k) p[k] -= lr * g[k];
      return;
    }
    float* __restrict buf = buffers_[param].data() + begin;
    for (std::size_t k = 0; k < n; ++k) {
      buf[k] = mu * buf[k] + g[k];
      p[k] -= lr * buf[k];
    }
  }

  std::vector<ddp::ParamBuffer> state() override {
    std::vector<ddp::ParamBuffer> out{{&steps_, 1, ddp::DType::kInt64}};
    for (auto& b : buffers_) out.push_back({b.data(), b.size(), ddp::DType::kFloat32});
    return out;
  }

  std::vector<std::vector<void*>> param_shaped_state() override {
    if (buffers_.empty()) return {};
    std::vector<void*> momentum;
    for (auto& b : buffers_) momentum.push_back(b.data());
    return {momentum};
  }

 private:
  float lr_, momentum_;
  std::vector<std::vector<float>> buffers_;
};

// torch.optim.Adam: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
class Adam final : public Optimizer {
 public:
  Adam(float lr, float beta1, float beta2, float eps, const std::vector<std::size_t>& counts)
      : Optimizer(counts), lr_(lr), beta1_(beta1), beta2_(beta2), eps_(eps) {
    for (std::size_t n : counts) {
      m_.emplace_back(n, 0.0f);
      v_.emplace_back(n, 0.0f);
    }
  }

  void update_range(std::size_t param, float* p_, const float* g_, std::size_t begin,
                    std::size_t end) override {
    float* __restrict p = p_ + begin;
    const float* __restrict g = g_ + begin;
    const std::size_t n = end - begin;
    const double t = static_cast<double>(steps_);
    const auto step_size = static_cast<float>(lr_ / (1.0 - std::pow(beta1_, t)));
    const auto inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(beta2_, t)));
    const float b1 = beta1_, b2 = beta2_, eps = eps_;
    float* __restrict m = m_[param].data() + begin;
    float* __restrict v = v_[param].data() + begin;
    for (std::size_t k = 0; k < n; ++k) {
      m[k] = b1 * m[k] + (1.0f - b1) * g[k];
      v[k] = b2 * v[k] + (1.0f - b2) * g[k] * g[k];
      p[k] -= step_size * m[k] / (std::sqrt(v[k]) * inv_bc2_sqrt + eps);
    }
  }

  std::vector<ddp::ParamBuffer> state() override {
    std::vector<ddp::ParamBuffer> out{{&steps_, 1, ddp::DType::kInt64}};
    for (std::size_t i = 0; i < m_.size(); ++i) {
      out.push_back({m_[i].data(), m_[i].size(), ddp::DType::kFloat32});
      out.push_back({v_[i].data(), v_[i].size(), ddp::DType::kFloat32});
    }
    return out;
  }

  std::vector<std::vector<void*>> param_shaped_state() override {
    std::vector<void*> m, v;
    for (std::size_t i = 0; i < m_.size(); ++i) {
      m.push_back(m_[i].data());
      v.push_back(v_[i].data());
    }
    return {m, v};
  }

 private:
  double lr_, beta1_, beta2_;
  float eps_;
  std::vector<std::vector<float>> m_, v_;
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const Config& c, const std::vector<std::size_t>& counts) {
  if (c.optimizer == OptimizerKind::kAdam) {
    return std::make_unique<Adam>(static_cast<float>(c.lr), static_cast<float>(c.beta1),
                                  static_cast<float>(c.beta2), static_cast<float>(c.eps), counts);
  }
  return std::make_unique<Sgd>(static_cast<float>(c.lr), static_cast<float>(c.momentum), counts);
}

}  // namespace train
