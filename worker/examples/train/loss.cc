#include "loss.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace train {

LossResult cross_entropy(const float* logits, const std::int32_t* labels, int batch, int classes,
                         float* dlogits) {
  LossResult result;
  const float inv_batch = 1.0f / static_cast<float>(batch);
  double total = 0;
  for (int i = 0; i < batch; ++i) {
    const float* z = logits + static_cast<std::size_t>(i) * classes;
    float* dz = dlogits + static_cast<std::size_t>(i) * classes;
    const int label = labels[i];
    int best = 0;
    float zmax = z[0];
    for (int j = 1; j < classes; ++j) {
      if (z[j] > zmax) {
        zmax = z[j];
        best = j;
      }
    }
    if (best == label) ++result.correct;
    const float z_label = z[label];
    double sum = 0;
    for (int j = 0; j < classes; ++j) sum += std::exp(static_cast<double>(z[j] - zmax));
    // log softmax of the label: z_label - zmax - log(sum).
    total += std::log(sum) - static_cast<double>(z_label - zmax);
    const double inv_sum = 1.0 / sum;
    for (int j = 0; j < classes; ++j) {
      const auto p = static_cast<float>(std::exp(static_cast<double>(z[j] - zmax)) * inv_sum);
      dz[j] = (p - (j == label ? 1.0f : 0.0f)) * inv_batch;
    }
  }
  result.loss = total / batch;
  return result;
}

LossResult mean_squared_error(const float* y, const float* target, int batch, int dim, float* dy) {
  LossResult result;
  const std::size_t n = static_cast<std::size_t>(batch) * static_cast<std::size_t>(dim);
  const float scale = 2.0f / static_cast<float>(n);
  double total = 0;
  for (std::size_t k = 0; k < n; ++k) {
    const float d = y[k] - target[k];
    total += static_cast<double>(d) * d;
    dy[k] = scale * d;
  }
  result.loss = total / static_cast<double>(n);
  return result;
}

}  // namespace train
