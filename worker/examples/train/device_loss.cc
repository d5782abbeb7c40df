#include "device_loss.h"

#include <cstddef>

#include "device_kernels.h"

namespace train {

DeviceLoss::DeviceLoss(const Gpu& gpu) : gpu_(gpu) {
  check_cuda(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming), "cudaEventCreate");
}

DeviceLoss::~DeviceLoss() {
  if (copied_ != nullptr) (void)cudaEventDestroy(copied_);
}

void DeviceLoss::reserve(int batch) {
  const auto rows = static_cast<std::size_t>(batch);
  row_loss_.reserve(rows);
  row_correct_.reserve(rows);
  host_loss_.reserve(rows);
  host_correct_.reserve(rows);
  batch_ = batch;
}

void DeviceLoss::copy_back(bool with_correct) {
  const auto rows = static_cast<std::size_t>(batch_);
  check_cuda(cudaMemcpyAsync(host_loss_.get(), row_loss_.get(), rows * sizeof(double),
                             cudaMemcpyDeviceToHost, gpu_.stream()),
             "cudaMemcpyAsync (loss to host)");
  if (with_correct) {
    check_cuda(cudaMemcpyAsync(host_correct_.get(), row_correct_.get(), rows * sizeof(std::int32_t),
                               cudaMemcpyDeviceToHost, gpu_.stream()),
               "cudaMemcpyAsync (accuracy to host)");
  }
  check_cuda(cudaEventRecord(copied_, gpu_.stream()), "cudaEventRecord");
  has_correct_ = with_correct;
  pending_ = true;
}

void DeviceLoss::cross_entropy(const float* logits, const std::int32_t* labels, int batch,
                               int classes, float* dlogits) {
  reserve(batch);
  kernels::cross_entropy(logits, labels, batch, classes, dlogits, row_loss_.get(),
                         row_correct_.get(), gpu_.stream());
  divisor_ = batch;
  copy_back(true);
}

void DeviceLoss::mean_squared_error(const float* y, const float* target, int batch, int dim,
                                    float* dy) {
  reserve(batch);
  kernels::squared_error(y, target, batch, dim, dy, row_loss_.get(), gpu_.stream());
  divisor_ = static_cast<double>(batch) * static_cast<double>(dim);
  copy_back(false);
}

LossResult DeviceLoss::result() {
  if (!pending_) throw ddp::Error("DeviceLoss::result: no loss was computed since the last one");
  check_cuda(cudaEventSynchronize(copied_), "cudaEventSynchronize (loss)");
  pending_ = false;
  LossResult r;
  double total = 0;
  for (int i = 0; i < batch_; ++i) {
    total += host_loss_.get()[i];
    if (has_correct_) r.correct += host_correct_.get()[i];
  }
  r.loss = total / divisor_;
  return r;
}

}  // namespace train
