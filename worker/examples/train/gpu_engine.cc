// The GPU engine (--backend nccl): DeviceMlp, DeviceLoss and DeviceOptimizer
// on CUDA device LOCAL_RANK. Each micro-batch is copied host -> device, the
// loss comes back as per-row values after the backward pass, gradients go
// into GradSync's device buckets, and checkpoints copy the device state to
// host buffers of the CPU path's layout and back.

#include <cuda_runtime.h>

#include "cuda_util.h"
#include "device_loss.h"
#include "device_mlp.h"
#include "device_optimizer.h"
#include "engine.h"

namespace train {
namespace {

std::string cuda_error_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

// The micro-batch's rows, copied in stream order (the previous step's
// kernels may still read the old ones).
template <typename T>
void upload(const Gpu& gpu, DeviceArray<T>& dst, const std::vector<T>& src) {
  dst.reserve(src.size());
  check_cuda(cudaMemcpyAsync(dst.get(), src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice,
                             gpu.stream()),
             "cudaMemcpyAsync (batch to device)");
}

class GpuEngine final : public Engine {
 public:
  GpuEngine(const Config& c, const std::vector<int>& dims, int device, int visible)
      : config_(c), visible_(visible), gpu_(device), model_(dims, c.seed, gpu_), loss_(gpu_) {
    std::vector<std::size_t> counts;
    for (std::size_t p = 0; p < model_.num_tensors(); ++p) counts.push_back(model_.count(p));
    opt_ = make_device_optimizer(c, counts, gpu_);
  }

  std::string description() const override {
    return gpu_.name() + ", cuBLAS; " + std::to_string(visible_) + " CUDA device(s) visible";
  }
  const std::vector<int>& dims() const override { return model_.dims(); }
  std::size_t num_elements() const override { return model_.num_elements(); }
  std::vector<ddp::GradParam> grad_params() const override { return model_.grad_params(); }

  void forward(const Batch& batch) override {
    upload(gpu_, x_, batch.x);
    const float* out = model_.forward(x_.get(), batch.size);
    if (config_.task == Task::kClassification) {
      upload(gpu_, labels_, batch.labels);
      loss_.cross_entropy(out, labels_.get(), batch.size, config_.output_dim, model_.output_grad());
    } else {
      upload(gpu_, y_, batch.y);
      loss_.mean_squared_error(out, y_.get(), batch.size, config_.output_dim, model_.output_grad());
    }
  }
  LossResult loss() override { return loss_.result(); }
  void backward(GradSink& sink, float scale, bool accumulate) override {
    model_.backward(sink, scale, accumulate);
  }
  void step(ddp::GradSync& sync) override { optimizer_step(model_, *opt_, sync); }

  // Device buffers only (ParamBuffer's contract with nccl): NCCL broadcasts
  // them in place on the device.
  void prepare(ddp::GradSync& sync) override {
    const auto state = opt_->state();
    sync.prepare(model_.data_pointers(), state);
    opt_->reload_state();
  }

  std::vector<ddp::ParamBuffer> host_state() override {
    device_state_ = model_and_optimizer_state(model_, *opt_);
    host_copies_.resize(device_state_.size());
    std::vector<ddp::ParamBuffer> host;
    for (std::size_t i = 0; i < device_state_.size(); ++i) {
      const auto& d = device_state_[i];
      host_copies_[i].resize(d.count * ddp::dtype_size(d.dtype));
      copy_to_host(gpu_, host_copies_[i].data(), d.data, host_copies_[i].size());
      host.push_back({host_copies_[i].data(), d.count, d.dtype});
    }
    return host;
  }
  void load_host_state() override {
    for (std::size_t i = 0; i < device_state_.size(); ++i)
      copy_to_device(gpu_, device_state_[i].data, host_copies_[i].data(), host_copies_[i].size());
    opt_->reload_state();
  }

 private:
  Config config_;
  int visible_;
  Gpu gpu_;
  DeviceMlp model_;
  DeviceLoss loss_;
  std::unique_ptr<DeviceOptimizer> opt_;
  DeviceArray<float> x_, y_;
  DeviceArray<std::int32_t> labels_;
  std::vector<ddp::ParamBuffer> device_state_;  // what host_state() copied
  std::vector<std::vector<unsigned char>> host_copies_;
};

int visible_devices(std::string* problem) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    *problem = "no CUDA device is visible (cudaGetDeviceCount: " + cuda_error_text(e) + ")";
    return 0;
  }
  if (n == 0) *problem = "no CUDA device is visible";
  return n;
}

}  // namespace

std::string gpu_problem(int device) {
  std::string problem;
  const int n = visible_devices(&problem);
  if (!problem.empty()) return problem;
  if (device < 0 || device >= n) {
    return "this rank computes on CUDA device " + std::to_string(device) +
           " (its LOCAL_RANK), but " + std::to_string(n) +
           " are visible (CUDA_VISIBLE_DEVICES): run at most " + std::to_string(n) +
           " rank(s) per node";
  }
  return "";
}

std::unique_ptr<Engine> make_gpu_engine(const Config& config, const std::vector<int>& dims,
                                        int device) {
  std::string problem = gpu_problem(device);
  if (!problem.empty()) throw ddp::Error(problem);
  return std::make_unique<GpuEngine>(config, dims, device, visible_devices(&problem));
}

}  // namespace train
