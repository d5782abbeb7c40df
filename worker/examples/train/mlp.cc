#include "mlp.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "ddp/common/error.h"
#include "ddp/grad_sync.h"
#include "ddp/shared_grad_sum.h"
#include "random.h"

namespace train {
namespace {

constexpr std::uint64_t kInitStream = 4;  // Random stream of the initial weights

}  // namespace

Mlp::Mlp(std::vector<int> dims, std::uint64_t seed) : dims_(std::move(dims)) {
  if (dims_.size() < 2) throw ddp::Error("Mlp: needs at least an input and an output size");
  for (int d : dims_) {
    if (d < 1) throw ddp::Error("Mlp: every layer size must be >= 1, got " + std::to_string(d));
  }
  Random rng(seed, kInitStream);
  for (int l = 0; l < num_layers(); ++l) {
    const int in = dims_[l], out = dims_[l + 1];
    const float bound = 1.0f / std::sqrt(static_cast<float>(in));
    std::vector<float> w(static_cast<std::size_t>(out) * in), b(static_cast<std::size_t>(out));
    for (auto& v : w) v = rng.uniform(-bound, bound);
    for (auto& v : b) v = rng.uniform(-bound, bound);
    tensors_.push_back(std::move(w));
    tensors_.push_back(std::move(b));
  }
  for (auto& t : tensors_) data_.push_back(t.data());
  act_.resize(static_cast<std::size_t>(num_layers()));
}

void Mlp::bind(const std::vector<float*>& storage, bool copy) {
  if (storage.size() != tensors_.size()) {
    throw ddp::Error("Mlp::bind: " + std::to_string(storage.size()) + " buffers for " +
                     std::to_string(tensors_.size()) + " parameters");
  }
  for (std::size_t p = 0; p < storage.size(); ++p) {
    if (copy && storage[p] != data_[p]) std::memcpy(storage[p], data_[p], count(p) * sizeof(float));
    data_[p] = storage[p];
  }
}

std::vector<void*> Mlp::data_pointers() {
  std::vector<void*> out;
  for (float* p : data_) out.push_back(p);
  return out;
}

std::vector<ddp::GradParam> Mlp::grad_params() const {
  std::vector<ddp::GradParam> out;
  for (int l = 0; l < num_layers(); ++l) {
    const std::string name = "fc" + std::to_string(l + 1);
    out.push_back({name + ".weight", {dims_[l + 1], dims_[l]}});
    out.push_back({name + ".bias", {dims_[l + 1]}});
  }
  return out;
}

float* Mlp::forward(const float* x, int batch) {
  x_ = x;
  batch_ = batch;
  const int widest = *std::max_element(dims_.begin(), dims_.end());
  const std::size_t rows = static_cast<std::size_t>(batch);
  if (dz_.size() < rows * widest) {
    dz_.resize(rows * widest);
    dz_next_.resize(rows * widest);
  }
  if (ones_.size() < rows) ones_.assign(rows, 1.0f);
  const float* in = x;
  for (int l = 0; l < num_layers(); ++l) {
    const int n_in = dims_[l], n_out = dims_[l + 1];
    const bool hidden = l + 1 < num_layers();
    act_[l].resize(rows * n_out);
    float* out = act_[l].data();
    const float* w = data_[2 * l];
    const float* b = data_[2 * l + 1];
    // out = in W^T + b: the bias is copied into every row, then the GEMM adds (beta = 1).
    for (std::size_t i = 0; i < rows; ++i) std::memcpy(out + i * n_out, b, n_out * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, n_out, n_in, 1.0f, in, n_in, w,
                n_in, 1.0f, out, n_out);
    if (hidden) {
      for (std::size_t k = 0; k < rows * n_out; ++k) out[k] = std::max(out[k], 0.0f);
    }
    in = out;
  }
  return act_.back().data();
}

namespace {

// dz := dz W (this rank's rows: batch x n_out times n_out x n_in), then
// through the ReLU whose output was `relu_out`.
void input_grad(const float* dz, const float* w, const float* relu_out, int batch, int n_out,
                int n_in, float* dz_in) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, n_in, n_out, 1.0f, dz, n_out, w,
              n_in, 0.0f, dz_in, n_in);
  const std::size_t n = static_cast<std::size_t>(batch) * n_in;
  for (std::size_t k = 0; k < n; ++k) {
    if (!(relu_out[k] > 0.0f)) dz_in[k] = 0.0f;
  }
}

// Rows [first, first + rows) of a layer's gradients over `samples` samples,
// dz holding their output gradients (samples x n_out) and in their inputs
// (samples x n_in), stored (beta 0) or added (beta 1) at `out`, which points
// at the first of those rows:
//   bias:   out[r] = scale * (column sums of dz), a GEMV with a vector of ones;
//   weight: out[r] = scale * dz[:, r]^T in   (rows x n_in).
void bias_grad_rows(const float* dz, const float* ones, int samples, int n_out, int first, int rows,
                    float scale, float beta, float* out) {
  cblas_sgemv(CblasRowMajor, CblasTrans, samples, rows, scale, dz + first, n_out, ones, 1, beta, out,
              1);
}
void weight_grad_rows(const float* dz, const float* in, int samples, int n_out, int n_in, int first,
                      int rows, float scale, float beta, float* out) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rows, n_in, samples, scale, dz + first, n_out,
              in, n_in, beta, out, n_in);
}

}  // namespace

void Mlp::backward(ddp::GradAverager& sync, float scale, bool accumulate) {
  const float beta = accumulate ? 1.0f : 0.0f;
  const int batch = batch_;
  for (int l = num_layers() - 1; l >= 0; --l) {
    const int n_in = dims_[l], n_out = dims_[l + 1];
    const float* in = l == 0 ? x_ : act_[l - 1].data();
    const std::size_t bias = 2 * static_cast<std::size_t>(l) + 1;
    const std::size_t weight = 2 * static_cast<std::size_t>(l);
    const float* dz = dz_.data();
    if (auto* shared = dynamic_cast<ddp::SharedGradSum*>(&sync)) {
      // Per block of rows (output units), beta saying whether this rank is the
      // block's first writer: the sum over ranks is made by the writes themselves.
      shared->contribute(bias, [&](const ddp::GradBlock& b) {
        bias_grad_rows(dz, ones_.data(), batch, n_out, static_cast<int>(b.row_begin),
                       static_cast<int>(b.rows), scale, b.accumulate ? 1.0f : 0.0f,
                       static_cast<float*>(b.data));
      });
      shared->contribute(weight, [&](const ddp::GradBlock& b) {
        weight_grad_rows(dz, in, batch, n_out, n_in, static_cast<int>(b.row_begin),
                         static_cast<int>(b.rows), scale, b.accumulate ? 1.0f : 0.0f,
                         static_cast<float*>(b.data));
      });
    } else {
      auto& buckets = dynamic_cast<ddp::GradSync&>(sync);
      bias_grad_rows(dz, ones_.data(), batch, n_out, 0, n_out, scale, beta, buckets.grad_view(bias));
      buckets.mark_ready(bias);
      weight_grad_rows(dz, in, batch, n_out, n_in, 0, n_out, scale, beta, buckets.grad_view(weight));
      buckets.mark_ready(weight);
    }
    if (l == 0) break;
    // dLoss/din = dz W, then through the ReLU of layer l-1's output.
    input_grad(dz_.data(), data_[weight], in, batch, n_out, n_in, dz_next_.data());
    std::swap(dz_, dz_next_);
  }
}

}  // namespace train
