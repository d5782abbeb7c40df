#pragma once
// The losses of loss.h on a GPU (the GPU path): the same values and
// gradients, computed by kernels (device_kernels.h) on the Gpu's stream.
//
// Unlike loss.h's functions, which return the loss, these only enqueue: the
// per-row losses are copied to pinned host memory behind the kernel, and
// result() waits for that copy and sums them in row order (deterministic).
// The trainer asks for the result after the backward pass, so the host never
// stalls the device between the loss and the backward GEMMs.

#include <cstdint>

#include "cuda_util.h"
#include "loss.h"

namespace train {

class DeviceLoss {
 public:
  explicit DeviceLoss(const Gpu& gpu);
  ~DeviceLoss();
  DeviceLoss(const DeviceLoss&) = delete;
  DeviceLoss& operator=(const DeviceLoss&) = delete;

  // As train::cross_entropy and train::mean_squared_error, every pointer in
  // device memory; the loss value comes from result().
  void cross_entropy(const float* logits, const std::int32_t* labels, int batch, int classes,
                     float* dlogits);
  void mean_squared_error(const float* y, const float* target, int batch, int dim, float* dy);

  // The loss of the last call (waits for it). REQUIRES: a call since the last result().
  LossResult result();

 private:
  void reserve(int batch);
  void copy_back(bool with_correct);

  const Gpu& gpu_;
  DeviceArray<double> row_loss_;
  DeviceArray<std::int32_t> row_correct_;
  PinnedArray<double> host_loss_;
  PinnedArray<std::int32_t> host_correct_;
  cudaEvent_t copied_ = nullptr;
  int batch_ = 0;
  double divisor_ = 1;        // batch (cross-entropy) or batch * dim (squared error)
  bool has_correct_ = false;  // classification: count the correct argmaxes
  bool pending_ = false;
};

}  // namespace train
