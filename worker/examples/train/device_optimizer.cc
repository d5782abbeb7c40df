#include "device_optimizer.h"

#include <cmath>

#include "device_kernels.h"

namespace train {

std::vector<ddp::ParamBuffer> DeviceOptimizer::state() {
  copy_to_device(gpu_, steps_word_.get(), &steps_, sizeof steps_);
  std::vector<ddp::ParamBuffer> out{{steps_word_.get(), 1, ddp::DType::kInt64}};
  for (const auto& b : buffers()) out.push_back(b);
  return out;
}

void DeviceOptimizer::reload_state() {
  copy_to_host(gpu_, &steps_, steps_word_.get(), sizeof steps_);
}

namespace {

std::vector<DeviceArray<float>> zeroed_like(const std::vector<std::size_t>& counts) {
  std::vector<DeviceArray<float>> out;
  for (std::size_t n : counts) out.emplace_back(n);
  return out;
}

ddp::ParamBuffer buffer_of(const DeviceArray<float>& a) {
  return {a.get(), a.size(), ddp::DType::kFloat32};
}

class DeviceSgd final : public DeviceOptimizer {
 public:
  DeviceSgd(float lr, float momentum, const std::vector<std::size_t>& counts, const Gpu& gpu)
      : DeviceOptimizer(gpu), lr_(lr), momentum_(momentum), counts_(counts) {
    if (momentum_ != 0.0f) momentum_buffers_ = zeroed_like(counts);
  }

  void update(std::size_t param, float* p, const float* g) override {
    if (momentum_buffers_.empty()) {
      kernels::sgd(p, g, counts_[param], lr_, gpu_.stream());
    } else {
      kernels::sgd_momentum(p, momentum_buffers_[param].get(), g, counts_[param], lr_, momentum_,
                            gpu_.stream());
    }
  }

 protected:
  std::vector<ddp::ParamBuffer> buffers() override {
    std::vector<ddp::ParamBuffer> out;
    for (const auto& b : momentum_buffers_) out.push_back(buffer_of(b));
    return out;
  }

 private:
  float lr_, momentum_;
  std::vector<std::size_t> counts_;
  std::vector<DeviceArray<float>> momentum_buffers_;
};

class DeviceAdam final : public DeviceOptimizer {
 public:
  DeviceAdam(double lr, double beta1, double beta2, float eps,
             const std::vector<std::size_t>& counts, const Gpu& gpu)
      : DeviceOptimizer(gpu),
        lr_(lr),
        beta1_(beta1),
        beta2_(beta2),
        eps_(eps),
        counts_(counts),
        m_(zeroed_like(counts)),
        v_(zeroed_like(counts)) {}

  void update(std::size_t param, float* p, const float* g) override {
    // The bias corrections, computed as optimizer.cc does (in double, then float).
    const double t = static_cast<double>(steps_);
    const auto step_size = static_cast<float>(lr_ / (1.0 - std::pow(beta1_, t)));
    const auto inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(beta2_, t)));
    kernels::adam(p, m_[param].get(), v_[param].get(), g, counts_[param], step_size, inv_bc2_sqrt,
                  static_cast<float>(beta1_), static_cast<float>(beta2_), eps_, gpu_.stream());
  }

 protected:
  std::vector<ddp::ParamBuffer> buffers() override {
    std::vector<ddp::ParamBuffer> out;
    for (std::size_t i = 0; i < m_.size(); ++i) {
      out.push_back(buffer_of(m_[i]));
      out.push_back(buffer_of(v_[i]));
    }
    return out;
  }

 private:
  double lr_, beta1_, beta2_;
  float eps_;
  std::vector<std::size_t> counts_;
  std::vector<DeviceArray<float>> m_, v_;
};

}  // namespace

std::unique_ptr<DeviceOptimizer> make_device_optimizer(const Config& c,
                                                       const std::vector<std::size_t>& counts,
                                                       const Gpu& gpu) {
  if (c.optimizer == OptimizerKind::kAdam) {
    return std::make_unique<DeviceAdam>(static_cast<float>(c.lr), static_cast<float>(c.beta1),
                                        static_cast<float>(c.beta2), static_cast<float>(c.eps),
                                        counts, gpu);
  }
  return std::make_unique<DeviceSgd>(static_cast<float>(c.lr), static_cast<float>(c.momentum),
                                     counts, gpu);
}

}  // namespace train
