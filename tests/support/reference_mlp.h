#pragma once
// Test support: a small MLP whose gradients are computed analytically in
// double, the reference GradSync's results are checked against (in-process
// unit tests and the worker run under ddprun).

#include <cmath>
#include <cstddef>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ddp/grad_sync.h"

namespace ddp::testing {

// y = W_L tanh(... tanh(W_1 x + b_1) ...) + b_L; loss = 1/(2n) sum_i ||y_i - t_i||^2
// over the n samples of a shard, so the mean over equal shards of their
// gradients is the whole batch's gradient.
struct Mlp {
  std::vector<int> sizes;                 // input, hidden..., output
  std::vector<std::vector<double>> w, b;  // w[l]: sizes[l+1] x sizes[l], row-major
};

struct Batch {
  std::vector<std::vector<double>> x, t;
};

inline Mlp make_mlp(std::vector<int> sizes, unsigned seed) {
  Mlp m;
  m.sizes = std::move(sizes);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-0.5, 0.5);
  for (std::size_t l = 0; l + 1 < m.sizes.size(); ++l) {
    m.w.emplace_back(static_cast<std::size_t>(m.sizes[l + 1] * m.sizes[l]));
    m.b.emplace_back(static_cast<std::size_t>(m.sizes[l + 1]));
    for (auto& v : m.w.back()) v = u(gen);
    for (auto& v : m.b.back()) v = u(gen);
  }
  return m;
}

inline Batch make_batch(const Mlp& m, int n, unsigned seed) {
  Batch batch;
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int i = 0; i < n; ++i) {
    batch.x.emplace_back(static_cast<std::size_t>(m.sizes.front()));
    batch.t.emplace_back(static_cast<std::size_t>(m.sizes.back()));
    for (auto& v : batch.x.back()) v = u(gen);
    for (auto& v : batch.t.back()) v = u(gen);
  }
  return batch;
}

// Registration order: fc1.weight, fc1.bias, fc2.weight, ...
inline std::vector<GradParam> mlp_params(const Mlp& m) {
  std::vector<GradParam> params;
  for (std::size_t l = 0; l + 1 < m.sizes.size(); ++l) {
    std::string layer = "fc" + std::to_string(l + 1);
    params.push_back({layer + ".weight", {m.sizes[l + 1], m.sizes[l]}, DType::kFloat32});
    params.push_back({layer + ".bias", {m.sizes[l + 1]}, DType::kFloat32});
  }
  return params;
}

// The order a backward pass produces gradients: last layer first, weight then bias.
inline std::vector<std::size_t> backward_order(const Mlp& m) {
  std::vector<std::size_t> order;
  for (std::size_t l = m.sizes.size() - 1; l-- > 0;) {
    order.push_back(2 * l);
    order.push_back(2 * l + 1);
  }
  return order;
}

// Gradients (registration order) of the loss over samples [begin, end).
inline std::vector<std::vector<double>> mlp_grads(const Mlp& m, const Batch& batch, int begin,
                                                  int end) {
  const std::size_t layers = m.w.size();
  std::vector<std::vector<double>> grads;
  for (std::size_t l = 0; l < layers; ++l) {
    grads.emplace_back(m.w[l].size(), 0.0);
    grads.emplace_back(m.b[l].size(), 0.0);
  }
  const double n = end - begin;
  for (int i = begin; i < end; ++i) {
    std::vector<std::vector<double>> a = {batch.x[i]};  // activations
    for (std::size_t l = 0; l < layers; ++l) {
      const int in = m.sizes[l], out = m.sizes[l + 1];
      std::vector<double> z(static_cast<std::size_t>(out));
      for (int o = 0; o < out; ++o) {
        double s = m.b[l][o];
        for (int k = 0; k < in; ++k) s += m.w[l][o * in + k] * a[l][k];
        z[o] = l + 1 < layers ? std::tanh(s) : s;
      }
      a.push_back(std::move(z));
    }
    std::vector<double> delta(a.back().size());
    for (std::size_t o = 0; o < delta.size(); ++o) delta[o] = (a.back()[o] - batch.t[i][o]) / n;
    for (std::size_t l = layers; l-- > 0;) {
      const int in = m.sizes[l], out = m.sizes[l + 1];
      for (int o = 0; o < out; ++o) {
        for (int k = 0; k < in; ++k) grads[2 * l][o * in + k] += delta[o] * a[l][k];
        grads[2 * l + 1][o] += delta[o];
      }
      if (l == 0) break;
      std::vector<double> next(static_cast<std::size_t>(in), 0.0);
      for (int k = 0; k < in; ++k) {
        for (int o = 0; o < out; ++o) next[k] += m.w[l][o * in + k] * delta[o];
        next[k] *= 1 - a[l][k] * a[l][k];  // tanh'
      }
      delta = std::move(next);
    }
  }
  return grads;
}

}  // namespace ddp::testing
