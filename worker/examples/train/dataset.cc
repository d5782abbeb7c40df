#include "dataset.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "ddp/common/error.h"
#include "random.h"

namespace train {
namespace {

constexpr int kTeacherHidden = 64;
constexpr float kRegressionNoise = 0.05f;
// Streams of the seed (Random's second argument).
constexpr std::uint64_t kFeatureStream = 1, kTeacherStream = 2, kNoiseStream = 3;
// Samples generated per teacher GEMM (bounds the scratch memory).
constexpr std::int64_t kChunk = 4096;

}  // namespace

SyntheticDataset::SyntheticDataset(Task task, std::int64_t size, int input_dim, int output_dim,
                                   std::uint64_t seed)
    : task_(task), size_(size), input_dim_(input_dim), output_dim_(output_dim) {
  if (size < 1 || input_dim < 1 || output_dim < 1 ||
      (task == Task::kClassification && output_dim < 2)) {
    throw ddp::Error("SyntheticDataset: bad shape: size " + std::to_string(size) + ", input_dim " +
                     std::to_string(input_dim) + ", output_dim " + std::to_string(output_dim));
  }
  const auto n = static_cast<std::size_t>(size);
  const auto in = static_cast<std::size_t>(input_dim);
  const auto out = static_cast<std::size_t>(output_dim);

  x_.resize(n * in);
  Random features(seed, kFeatureStream);
  for (auto& v : x_) v = features.normal();

  // The teacher: W1 [64 x in], W2 [out x 64], scaled so tanh is not saturated
  // and the outputs have unit-order spread.
  Random teacher(seed, kTeacherStream);
  std::vector<float> w1(kTeacherHidden * in), w2(out * kTeacherHidden);
  const float s1 = 1.0f / std::sqrt(static_cast<float>(in));
  const float s2 = 1.5f / std::sqrt(static_cast<float>(kTeacherHidden));
  for (auto& v : w1) v = teacher.normal() * s1;
  for (auto& v : w2) v = teacher.normal() * s2;

  if (task == Task::kRegression) {
    y_.resize(n * out);
  } else {
    labels_.resize(n);
  }
  Random noise(seed, kNoiseStream);
  std::vector<float> h(static_cast<std::size_t>(kChunk) * kTeacherHidden);
  std::vector<float> t(static_cast<std::size_t>(kChunk) * out);
  for (std::int64_t begin = 0; begin < size; begin += kChunk) {
    const int rows = static_cast<int>(std::min(kChunk, size - begin));
    const float* xb = x_.data() + static_cast<std::size_t>(begin) * in;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, kTeacherHidden, input_dim, 1.0f, xb,
                input_dim, w1.data(), input_dim, 0.0f, h.data(), kTeacherHidden);
    for (std::size_t k = 0; k < static_cast<std::size_t>(rows) * kTeacherHidden; ++k) {
      h[k] = std::tanh(h[k]);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, output_dim, kTeacherHidden, 1.0f,
                h.data(), kTeacherHidden, w2.data(), kTeacherHidden, 0.0f, t.data(), output_dim);
    for (int r = 0; r < rows; ++r) {
      const float* row = t.data() + static_cast<std::size_t>(r) * out;
      const auto i = static_cast<std::size_t>(begin) + static_cast<std::size_t>(r);
      if (task == Task::kRegression) {
        for (std::size_t j = 0; j < out; ++j)
          y_[i * out + j] = row[j] + kRegressionNoise * noise.normal();
      } else {
        std::size_t best = 0;
        for (std::size_t j = 1; j < out; ++j) {
          if (row[j] > row[best]) best = j;
        }
        labels_[i] = static_cast<std::int32_t>(best);
      }
    }
  }
}

void SyntheticDataset::gather(std::span<const std::int64_t> indices, Batch& batch) const {
  const auto in = static_cast<std::size_t>(input_dim_);
  const auto out = static_cast<std::size_t>(output_dim_);
  const std::size_t n = indices.size();
  batch.size = static_cast<int>(n);
  batch.x.resize(n * in);
  if (task_ == Task::kRegression) {
    batch.y.resize(n * out);
  } else {
    batch.labels.resize(n);
  }
  for (std::size_t r = 0; r < n; ++r) {
    const std::int64_t i = indices[r];
    if (i < 0 || i >= size_) {
      throw ddp::Error("SyntheticDataset: index " + std::to_string(i) + " outside [0, " +
                       std::to_string(size_) + ")");
    }
    const auto u = static_cast<std::size_t>(i);
    std::memcpy(batch.x.data() + r * in, x_.data() + u * in, in * sizeof(float));
    if (task_ == Task::kRegression) {
      std::memcpy(batch.y.data() + r * out, y_.data() + u * out, out * sizeof(float));
    } else {
      batch.labels[r] = labels_[u];
    }
  }
}

}  // namespace train
