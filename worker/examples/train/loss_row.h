#pragma once
// One sample's softmax cross-entropy, shared by loss.cc (the CPU, a loop over
// rows) and device_kernels.cu (the GPU, a thread per row), so that both paths
// compute the same numbers the same way. Plain C++ for the host compiler;
// nvcc compiles it for the device as well.

#include <math.h>

#ifdef __CUDACC__
#define TRAIN_HOST_DEVICE __host__ __device__
#else
#define TRAIN_HOST_DEVICE
#endif

namespace train {

// z: the row's `classes` logits. Returns -log softmax(z)[label] (in double),
// writes dz[j] = (softmax(z)_j - [j == label]) * inv_batch (dz may alias z)
// and sets *correct to whether argmax z == label (the first maximum).
TRAIN_HOST_DEVICE inline double cross_entropy_row(const float* z, int label, int classes,
                                                  float inv_batch, float* dz, bool* correct) {
  int best = 0;
  float zmax = z[0];
  for (int j = 1; j < classes; ++j) {
    if (z[j] > zmax) {
      zmax = z[j];
      best = j;
    }
  }
  *correct = best == label;
  const float z_label = z[label];
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

}  // namespace train
