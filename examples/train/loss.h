#pragma once
// The trainer's two losses, each returning the batch mean and writing its
// gradient with respect to the model's outputs (the start of backward). One
// sample's cross-entropy, cross_entropy_row(), is shared by the CPU (a loop
// over rows, below) and the GPU (a thread per row, device_kernels.cu), so
// that both engines compute the same numbers the same way: plain C++ that
// nvcc compiles for the device as well.

#include <math.h>

#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#define TRAIN_HOST_DEVICE __host__ __device__
#else
#define TRAIN_HOST_DEVICE
#endif

namespace train {

struct LossResult {
  double loss = 0;           // mean over the batch
  std::int64_t correct = 0;  // classification: samples whose argmax is the label
};

// z: the row's `classes` logits. Returns -log softmax(z)[label] (in double),
// writes dz[j] = (softmax(z)_j - [j == label]) * inv_batch (dz may alias z)
// and sets *correct to whether argmax z == label (the first maximum).
TRAIN_HOST_DEVICE inline double cross_entropy_row(const float* z, int label, int classes,
                                                  float inv_batch, float* dz, bool* correct) {
  int best = 0;
  for (int j = 1; j < classes; ++j) best = z[j] > z[best] ? j : best;
  *correct = best == label;
  const float zmax = z[best], z_label = z[label];
  double sum = 0;
  for (int j = 0; j < classes; ++j) sum += exp(static_cast<double>(z[j] - zmax));
  const double inv_sum = 1.0 / sum;
  for (int j = 0; j < classes; ++j) {
    const auto p = static_cast<float>(exp(static_cast<double>(z[j] - zmax)) * inv_sum);
    dz[j] = (p - (j == label ? 1.0f : 0.0f)) * inv_batch;
  }
  // log softmax of the label: z_label - zmax - log(sum).
  return log(sum) - static_cast<double>(z_label - zmax);
}

// Softmax cross-entropy, averaged over the batch: dlogits = (softmax - onehot) / batch.
// logits and dlogits are batch x classes, row-major (they may alias).
inline LossResult cross_entropy(const float* logits, const std::int32_t* labels, int batch,
                                int classes, float* dlogits) {
  LossResult result;
  double total = 0;
  for (int i = 0; i < batch; ++i) {
    const std::size_t row = static_cast<std::size_t>(i) * classes;
    bool correct = false;
    total += cross_entropy_row(logits + row, labels[i], classes, 1.0f / static_cast<float>(batch),
                               dlogits + row, &correct);
    result.correct += correct ? 1 : 0;
  }
  result.loss = total / batch;
  return result;
}

// Mean squared error over every element (torch's MSELoss): dy = 2 (y - t) / (batch * dim).
inline LossResult mean_squared_error(const float* y, const float* target, int batch, int dim,
                                     float* dy) {
  const std::size_t n = static_cast<std::size_t>(batch) * static_cast<std::size_t>(dim);
  const float scale = 2.0f / static_cast<float>(n);
  double total = 0;
  for (std::size_t k = 0; k < n; ++k) {
    const float d = y[k] - target[k];
    total += static_cast<double>(d) * d;
    dy[k] = scale * d;
  }
  return {total / static_cast<double>(n), 0};
}

}  // namespace train
