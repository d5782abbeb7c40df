#include "mlp.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "ddp/grad_sync.h"
#include "ddp/shared_grad_sum.h"
#include "random.h"

namespace train {
namespace {

constexpr std::uint64_t kInitStream = 4;  // Random stream of the initial weights

// A large layer's GEMMs run in pieces of about this many bytes of its
// weights, with a peer check between two pieces: a step that a dead peer has
// already voided stops within milliseconds, not after the layer's whole pass
// (a 537 MB layer takes 0.2-0.5 s to read when 4 ranks share 2 cores), so
// the survivors reform, and admit the dead rank's relaunch, that much sooner.
// A layer smaller than a piece runs in one GEMM, as before.
constexpr std::size_t kPieceBytes = std::size_t{16} << 20;

// Calls work(first, count) over [0, rows) in pieces of kPieceBytes of rows of
// `row_floats` floats, asking peers->check_peers() between two (null: never).
template <typename Work>
void in_pieces(int rows, int row_floats, ddp::ProcessGroup* peers, Work&& work) {
  const std::size_t row_bytes = std::max<std::size_t>(row_floats, 1) * sizeof(float);
  const int piece = static_cast<int>(std::max<std::size_t>(kPieceBytes / row_bytes, 1));
  for (int first = 0; first < rows; first += piece) {
    if (first > 0 && peers != nullptr) peers->check_peers();
    work(first, std::min(piece, rows - first));
  }
}

}  // namespace

Mlp::Mlp(std::vector<int> dims, std::uint64_t seed, bool draw, float* storage)
    : dims_(std::move(dims)), counts_(param_counts(dims_)) {
  if (!storage) {
    own_.assign(param_floats(dims_), 0.0f);
    storage = own_.data();
  }
  for (std::size_t n : counts_) {
    data_.push_back(storage);
    storage += n;
  }
  Random rng(seed, kInitStream);
  for (int l = 0; draw && l < num_layers(); ++l) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(dims_[l]));
    for (std::size_t p = 2 * static_cast<std::size_t>(l); p < 2 * static_cast<std::size_t>(l) + 2;
         ++p)
      for (std::size_t i = 0; i < counts_[p]; ++i) data_[p][i] = rng.uniform(-bound, bound);
  }
  act_.resize(static_cast<std::size_t>(num_layers()));
}

std::vector<std::size_t> Mlp::param_counts(const std::vector<int>& dims) {
  std::vector<std::size_t> counts;
  for (std::size_t l = 0; l + 1 < dims.size(); ++l) {
    const auto in = static_cast<std::size_t>(dims[l]), out = static_cast<std::size_t>(dims[l + 1]);
    counts.push_back(out * in);  // weight
    counts.push_back(out);       // bias
  }
  return counts;
}

std::size_t Mlp::param_floats(const std::vector<int>& dims) {
  std::size_t total = 0;
  for (std::size_t n : param_counts(dims)) total += n;
  return total;
}

void Mlp::bind(const std::vector<float*>& storage, bool copy) {
  for (std::size_t p = 0; p < storage.size(); ++p) {
    if (copy && storage[p] != data_[p]) std::memcpy(storage[p], data_[p], count(p) * sizeof(float));
    data_[p] = storage[p];
  }
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

float* Mlp::forward(const float* x, int batch, ddp::ProcessGroup* peers) {
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
    // out = in W^T + b: the bias is copied into every row, then the GEMM adds
    // (beta = 1), a piece of W's rows (out's columns) at a time.
    for (std::size_t i = 0; i < rows; ++i) std::memcpy(out + i * n_out, b, n_out * sizeof(float));
    in_pieces(n_out, n_in, peers, [&](int first, int count) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, count, n_in, 1.0f, in, n_in,
                  w + static_cast<std::size_t>(first) * n_in, n_in, 1.0f, out + first, n_out);
    });
    if (hidden) {
      for (std::size_t k = 0; k < rows * n_out; ++k) out[k] = std::max(out[k], 0.0f);
    }
    in = out;
  }
  return act_.back().data();
}

namespace {

// dz := dz W (this rank's rows: batch x n_out times n_out x n_in), summed a
// piece of W's rows at a time, then through the ReLU whose output was `relu_out`.
void input_grad(const float* dz, const float* w, const float* relu_out, int batch, int n_out,
                int n_in, float* dz_in, ddp::ProcessGroup& peers) {
  in_pieces(n_out, n_in, &peers, [&](int first, int count) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, n_in, count, 1.0f, dz + first,
                n_out, w + static_cast<std::size_t>(first) * n_in, n_in, first == 0 ? 0.0f : 1.0f,
                dz_in, n_in);
  });
  const std::size_t n = static_cast<std::size_t>(batch) * n_in;
  for (std::size_t k = 0; k < n; ++k) {
    if (!(relu_out[k] > 0.0f)) dz_in[k] = 0.0f;
  }
}

}  // namespace

void Mlp::backward(ddp::GradAverager& sync, float scale) {
  const int batch = batch_;
  for (int l = num_layers() - 1; l >= 0; --l) {
    // A step that cannot commit (a peer died) stops before the next layer's work.
    if (l < num_layers() - 1) sync.group().check_peers();
    const int n_in = dims_[l], n_out = dims_[l + 1];
    const float* in = l == 0 ? x_ : act_[l - 1].data();
    const std::size_t bias = 2 * static_cast<std::size_t>(l) + 1;
    const std::size_t weight = 2 * static_cast<std::size_t>(l);
    const float* dz = dz_.data();
    // A block of the layer's gradients: rows [row_begin, row_begin + rows)
    // (output units), stored (beta 0) or added (beta 1: b.accumulate) at
    // b.data, which points at the first of those rows:
    //   bias:   scale * (column sums of dz), a GEMV with a vector of ones;
    //   weight: scale * dz[:, rows]^T in   (rows x n_in).
    const auto bias_rows = [&](const ddp::GradBlock& b) {
      cblas_sgemv(CblasRowMajor, CblasTrans, batch, static_cast<int>(b.rows), scale,
                  dz + b.row_begin, n_out, ones_.data(), 1, b.accumulate ? 1.0f : 0.0f,
                  static_cast<float*>(b.data), 1);
    };
    // A block larger than a piece (GradSync's: the whole gradient) is
    // written a piece at a time; SharedGradSum's blocks are smaller than one.
    const auto weight_rows = [&](const ddp::GradBlock& b) {
      in_pieces(static_cast<int>(b.rows), n_in, &sync.group(), [&](int first, int count) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, count, n_in, batch, scale,
                    dz + b.row_begin + first, n_out, in, n_in, b.accumulate ? 1.0f : 0.0f,
                    static_cast<float*>(b.data) + static_cast<std::size_t>(first) * n_in, n_in);
      });
    };
    // Per block of rows, b.accumulate saying whether to add: with a
    // SharedGradSum, whether this rank is the block's first writer (the sum
    // over ranks is made by the writes themselves); with a GradSync (one
    // block, the whole gradient), whether an earlier micro-step of the
    // accumulation window wrote it.
    sync.contribute(bias, bias_rows);
    sync.contribute(weight, weight_rows);
    if (l == 0) break;
    // dLoss/din = dz W, then through the ReLU of layer l-1's output.
    input_grad(dz_.data(), data_[weight], in, batch, n_out, n_in, dz_next_.data(), sync.group());
    std::swap(dz_, dz_next_);
  }
}

}  // namespace train
