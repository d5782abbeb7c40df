#pragma once
// The two losses of the trainer, each returning the batch mean and writing
// its gradient with respect to the model's outputs (the start of backward).

#include <cstdint>

namespace train {

struct LossResult {
  double loss = 0;           // mean over the batch
  std::int64_t correct = 0;  // classification: samples whose argmax is the label
};

// Softmax cross-entropy, averaged over the batch: dlogits = (softmax - onehot) / batch.
// logits and dlogits are batch x classes, row-major (they may alias).
LossResult cross_entropy(const float* logits, const std::int32_t* labels, int batch, int classes,
                         float* dlogits);

// Mean squared error over every element (torch's MSELoss): dy = 2 (y - t) / (batch * dim).
LossResult mean_squared_error(const float* y, const float* target, int batch, int dim, float* dy);

}  // namespace train
