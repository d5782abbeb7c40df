#include "loss.h"

#include <cstddef>

#include "loss_row.h"

namespace train {

LossResult cross_entropy(const float* logits, const std::int32_t* labels, int batch, int classes,
                         float* dlogits) {
  LossResult result;
  const float inv_batch = 1.0f / static_cast<float>(batch);
  double total = 0;
  for (int i = 0; i < batch; ++i) {
    const std::size_t row = static_cast<std::size_t>(i) * classes;
    bool correct = false;
    total +=
        cross_entropy_row(logits + row, labels[i], classes, inv_batch, dlogits + row, &correct);
    if (correct) ++result.correct;
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
