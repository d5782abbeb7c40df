#pragma once
// The model of mlp.h on a GPU (the GPU path, --backend nccl): the same
// layers, parameter numbering and initial weights (built by Mlp on the host
// from the same seed, then copied), with parameters, activations and
// gradients in device memory, the GEMMs on cuBLAS and the bias, ReLU and
// ReLU-mask on small kernels (device_kernels.h), all on the Gpu's stream.
//
// cuBLAS is column-major; the model keeps mlp.h's row-major layout. A
// row-major [r x c] matrix is, read column-major, its transpose [c x r] with
// leading dimension c, so each row-major product C = A B is computed as the
// column-major C^T = B^T A^T with the same pointers (see device_mlp.cc).

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda_util.h"
#include "ddp/grad_sync.h"
#include "mlp.h"

namespace train {

class DeviceMlp {
 public:
  // The weights Mlp(dims, seed) starts from, on gpu's device.
  DeviceMlp(std::vector<int> dims, std::uint64_t seed, const Gpu& gpu);
  ~DeviceMlp();
  DeviceMlp(const DeviceMlp&) = delete;
  DeviceMlp& operator=(const DeviceMlp&) = delete;

  int num_layers() const { return static_cast<int>(dims_.size()) - 1; }
  const std::vector<int>& dims() const { return dims_; }

  std::size_t num_tensors() const { return tensors_.size(); }
  std::size_t count(std::size_t param) const { return tensors_[param].size(); }
  std::size_t num_elements() const;
  // Device pointers.
  float* data(std::size_t param) { return tensors_[param].get(); }
  std::vector<void*> data_pointers();
  // Names and shapes as Mlp's, with device = the Gpu's (GradSync's buckets
  // are then device memory, reduced by NCCL).
  const std::vector<ddp::GradParam>& grad_params() const { return params_; }

  // As Mlp::forward, with `x` (batch x input_dim) and the result in device
  // memory; enqueued on the stream (nothing waits).
  float* forward(const float* x, int batch);
  // The device buffer (batch x output_dim) the loss writes dLoss/dOutputs into.
  float* output_grad() { return dz_.get(); }
  // As Mlp::backward, with sink.grad(p) device memory. Before sink.ready(p)
  // the kernels writing p's gradient have completed (an event is waited on),
  // as GradSync::mark_ready requires; the next layer's input gradient is
  // already enqueued by then, so the device keeps working while NCCL starts.
  void backward(GradSink& sink, float scale, bool accumulate);

 private:
  const Gpu& gpu_;
  std::vector<int> dims_;
  std::vector<ddp::GradParam> params_;
  std::vector<DeviceArray<float>> tensors_;
  int batch_ = 0;
  const float* x_ = nullptr;
  std::vector<DeviceArray<float>> act_;  // act_[l]: output of layer l (post-ReLU for hidden)
  DeviceArray<float> dz_, dz_next_, ones_;
  cudaEvent_t grads_done_ = nullptr;
};

}  // namespace train
