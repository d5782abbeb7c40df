// The GPU engine (--backend nccl): the CPU engine's model, losses and
// optimizers on CUDA device LOCAL_RANK, all on one stream (Gpu, gpu_runtime.h),
// with parameters, activations, gradients and optimizer state in device
// memory, the GEMMs on cuBLAS and the rest on small kernels (device_kernels.h).
// Each micro-batch is copied host -> device, the loss comes back as per-row
// values after the backward pass, gradients go into GradSync's device
// buckets (reduced by NCCL), and checkpoints copy the device state to host
// buffers of the CPU engine's layout and back.
//
// cuBLAS is column-major; the model keeps mlp.h's row-major layout. A
// row-major [r x c] matrix is, read column-major, its transpose [c x r] with
// leading dimension c, so each row-major product C = A B is computed as the
// column-major C^T = B^T A^T with the same pointers.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "cuda_util.h"
#include "ddp/grad_sync.h"
#include "device_kernels.h"
#include "engine.h"
#include "gpu_runtime.h"

namespace train {
namespace {

constexpr float kOne = 1.0f;
constexpr float kZero = 0.0f;

// Mlp on the device: the same layers, parameter numbering and initial
// weights (drawn by Mlp on the host from the same seed, then copied).
class DeviceMlp {
 public:
  DeviceMlp(std::vector<int> dims, std::uint64_t seed, const Gpu& gpu) : gpu_(gpu) {
    Mlp host(std::move(dims), seed);
    dims_ = host.dims();
    params_ = host.grad_params();
    for (auto& p : params_) p.device = gpu.device();  // GradSync's buckets: device memory
    for (std::size_t p = 0; p < host.num_tensors(); ++p) {
      DeviceArray<float> tensor(host.count(p));
      copy_to_device(gpu_, tensor.get(), host.data(p), tensor.bytes());
      tensors_.push_back(std::move(tensor));
    }
    act_.resize(dims_.size() - 1);
  }

  int num_layers() const { return static_cast<int>(dims_.size()) - 1; }
  std::size_t num_tensors() const { return tensors_.size(); }
  std::size_t count(std::size_t param) const { return tensors_[param].size(); }
  float* data(std::size_t param) { return tensors_[param].get(); }
  const std::vector<ddp::GradParam>& grad_params() const { return params_; }
  float* output_grad() { return dz_.get(); }

  // As Mlp::forward, on the device; enqueued on the stream (nothing waits).
  float* forward(const float* x, int batch) {
    x_ = x;
    batch_ = batch;
    const auto rows = static_cast<std::size_t>(batch);
    const auto widest = static_cast<std::size_t>(*std::max_element(dims_.begin(), dims_.end()));
    dz_.reserve(rows * widest);
    dz_next_.reserve(rows * widest);
    if (ones_.size() < rows) {
      ones_ = DeviceArray<float>(rows);
      const std::vector<float> ones(rows, 1.0f);
      copy_to_device(gpu_, ones_.get(), ones.data(), ones_.bytes());
    }
    const float* in = x;
    for (int l = 0; l < num_layers(); ++l) {
      const int n_in = dims_[l], n_out = dims_[l + 1];
      act_[l].reserve(rows * n_out);
      // out = in W^T [batch x n_out], i.e. column-major out^T = W in^T: W read
      // column-major is W^T (ld n_in), hence OP_T; in read column-major is in^T.
      check_cublas(
          cublas().sgemm(gpu_.blas(), CUBLAS_OP_T, CUBLAS_OP_N, n_out, batch, n_in, &kOne,
                         tensors_[2 * l].get(), n_in, in, n_in, &kZero, act_[l].get(), n_out),
          "cublasSgemm (forward)");
      kernels::add_bias(act_[l].get(), tensors_[2 * l + 1].get(), batch, n_out,
                        l + 1 < num_layers(), gpu_.stream());
      in = act_[l].get();
    }
    return act_.back().get();
  }

  // As Mlp::backward, with sync's views in device memory. Before mark_ready(p)
  // the kernels writing p's gradient have completed (an event is waited on),
  // as GradSync::mark_ready requires; the next layer's input gradient is
  // already enqueued by then, so the device keeps working while NCCL starts.
  void backward(ddp::GradSync& sync, float scale, bool accumulate) {
    const float beta = accumulate ? 1.0f : 0.0f;
    const int batch = batch_;
    const cublasHandle_t blas = gpu_.blas();
    for (int l = num_layers() - 1; l >= 0; --l) {
      const int n_in = dims_[l], n_out = dims_[l + 1];
      const float* in = l == 0 ? x_ : act_[l - 1].get();
      // dLoss/db = scale * dz^T 1: dz read column-major is dz^T [n_out x batch].
      const std::size_t weight = 2 * static_cast<std::size_t>(l), bias = weight + 1;
      check_cublas(cublas().sgemv(blas, CUBLAS_OP_N, n_out, batch, &scale, dz_.get(), n_out,
                                  ones_.get(), 1, &beta, sync.grad_view(bias), 1),
                   "cublasSgemv (bias gradient)");
      // dLoss/dW = scale * dz^T in [n_out x n_in], i.e. column-major
      // dW^T [n_in x n_out] = scale * in^T dz: `in` as stored, dz transposed.
      check_cublas(cublas().sgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, n_in, n_out, batch, &scale, in,
                                  n_in, dz_.get(), n_out, &beta, sync.grad_view(weight), n_in),
                   "cublasSgemm (weight gradient)");
      grads_done_.record(gpu_.stream());
      if (l > 0) {
        // dLoss/din = dz W [batch x n_in], i.e. column-major din^T = W^T dz^T:
        // both as stored. Then through the ReLU of layer l-1's output.
        check_cublas(cublas().sgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, n_in, batch, n_out, &kOne,
                                    tensors_[weight].get(), n_in, dz_.get(), n_out, &kZero,
                                    dz_next_.get(), n_in),
                     "cublasSgemm (input gradient)");
        kernels::relu_backward(dz_next_.get(), in, static_cast<std::size_t>(batch) * n_in,
                               gpu_.stream());
      }
      // This layer's gradients are complete (the next one's input gradient
      // still runs): GradSync may hand them to NCCL.
      grads_done_.wait("gradients");
      sync.mark_ready(bias);
      sync.mark_ready(weight);
      if (l == 0) break;
      std::swap(dz_, dz_next_);
    }
  }

 private:
  const Gpu& gpu_;
  std::vector<int> dims_;
  std::vector<ddp::GradParam> params_;
  std::vector<DeviceArray<float>> tensors_;
  int batch_ = 0;
  const float* x_ = nullptr;
  std::vector<DeviceArray<float>> act_;  // act_[l]: output of layer l (post-ReLU for hidden)
  DeviceArray<float> dz_, dz_next_, ones_;
  Event grads_done_;
};

// The losses of loss.h on the device. compute() only enqueues: the per-row
// losses are copied to pinned host memory behind the kernel, and result()
// waits for that copy and sums them in row order (deterministic). The
// trainer asks after the backward pass, so the host never stalls the device
// in between.
class DeviceLoss {
 public:
  explicit DeviceLoss(const Gpu& gpu) : gpu_(gpu) {}

  // The loss of `out` (batch x width) against `truth` (classification: the
  // labels; regression: the targets), its gradient into `grad`.
  void compute(Task task, const float* out, const void* truth, int batch, int width, float* grad) {
    const auto rows = static_cast<std::size_t>(batch);
    row_loss_.reserve(rows);
    host_loss_.reserve(rows);
    row_correct_.reserve(rows);
    host_correct_.reserve(rows);
    batch_ = batch;
    classification_ = task == Task::kClassification;
    divisor_ = classification_ ? batch : static_cast<double>(batch) * width;
    if (classification_) {
      kernels::cross_entropy(out, static_cast<const std::int32_t*>(truth), batch, width, grad,
                             row_loss_.get(), row_correct_.get(), gpu_.stream());
      check_cuda(
          cudaMemcpyAsync(host_correct_.get(), row_correct_.get(), rows * sizeof(std::int32_t),
                          cudaMemcpyDeviceToHost, gpu_.stream()),
          "cudaMemcpyAsync (accuracy to host)");
    } else {
      kernels::squared_error(out, static_cast<const float*>(truth), batch, width, grad,
                             row_loss_.get(), gpu_.stream());
    }
    check_cuda(cudaMemcpyAsync(host_loss_.get(), row_loss_.get(), rows * sizeof(double),
                               cudaMemcpyDeviceToHost, gpu_.stream()),
               "cudaMemcpyAsync (loss to host)");
    copied_.record(gpu_.stream());
  }
  // The loss of the last compute() (waits for it).
  LossResult result() {
    copied_.wait("loss");
    LossResult r;
    double total = 0;
    for (int i = 0; i < batch_; ++i) {
      total += host_loss_.get()[i];
      if (classification_) r.correct += host_correct_.get()[i];
    }
    r.loss = total / divisor_;
    return r;
  }

 private:
  const Gpu& gpu_;
  DeviceArray<double> row_loss_;
  DeviceArray<std::int32_t> row_correct_;
  PinnedArray<double> host_loss_;
  PinnedArray<std::int32_t> host_correct_;
  Event copied_;
  int batch_ = 0;
  double divisor_ = 1;  // batch (cross-entropy) or batch * width (squared error)
  bool classification_ = false;
};

// optimizer.h's rules as kernels, its state in device memory with the same
// layout (the step count first, then the buffers in parameter order), so a
// checkpoint of either engine loads into the other. The step count, which
// the host needs for Adam's bias correction, is mirrored in one device word:
// state() writes it there and reload_state() reads it back after something
// (a broadcast, a checkpoint load) overwrote the buffers.
class DeviceOptimizer {
 public:
  DeviceOptimizer(const Config& c, const std::vector<std::size_t>& counts, const Gpu& gpu)
      : gpu_(gpu),
        adam_(c.optimizer == OptimizerKind::kAdam),
        lr_(static_cast<float>(c.lr)),
        momentum_(static_cast<float>(c.momentum)),
        beta1_(static_cast<float>(c.beta1)),
        beta2_(static_cast<float>(c.beta2)),
        eps_(static_cast<float>(c.eps)),
        counts_(counts),
        steps_word_(1) {
    const int groups = adam_ ? 2 : momentum_ != 0.0f ? 1 : 0;
    for (std::size_t n : counts) {
      for (int g = 0; g < groups; ++g) buffers_.emplace_back(n);  // zeroed
    }
  }

  void begin_step() { ++steps_; }
  // Enqueues this step's update of parameter `param` (device memory).
  void update(std::size_t param, float* p, const float* g) {
    const std::size_t n = counts_[param];
    if (!adam_) {
      float* buf = buffers_.empty() ? nullptr : buffers_[param].get();
      return kernels::sgd(p, buf, g, n, lr_, momentum_, gpu_.stream());
    }
    // The bias corrections, computed as optimizer.cc does (in double, then float).
    const double t = static_cast<double>(steps_);
    const auto step_size = static_cast<float>(lr_ / (1.0 - std::pow(double{beta1_}, t)));
    const auto inv_bc2_sqrt =
        static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(double{beta2_}, t)));
    kernels::adam(p, buffers_[2 * param].get(), buffers_[2 * param + 1].get(), g, n, step_size,
                  inv_bc2_sqrt, beta1_, beta2_, eps_, gpu_.stream());
  }
  std::vector<ddp::ParamBuffer> state() {
    copy_to_device(gpu_, steps_word_.get(), &steps_, sizeof steps_);
    std::vector<ddp::ParamBuffer> out{{steps_word_.get(), 1, ddp::DType::kInt64}};
    for (const auto& b : buffers_) out.push_back({b.get(), b.size(), ddp::DType::kFloat32});
    return out;
  }
  void reload_state() { copy_to_host(gpu_, &steps_, steps_word_.get(), sizeof steps_); }

 private:
  const Gpu& gpu_;
  bool adam_;
  float lr_, momentum_, beta1_, beta2_, eps_;
  std::vector<std::size_t> counts_;
  std::vector<DeviceArray<float>> buffers_;  // per parameter: momentum, or Adam's m and v
  std::int64_t steps_ = 0;
  DeviceArray<std::int64_t> steps_word_;
};

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
      : config_(c),
        visible_(visible),
        gpu_(device),
        model_(dims, c.seed, gpu_),
        loss_(gpu_),
        opt_(c, param_counts(model_), gpu_) {}

  std::string description() const override {
    return gpu_.name() + ", cuBLAS; " + std::to_string(visible_) + " CUDA device(s) visible";
  }
  std::vector<ddp::GradParam> grad_params() const override { return model_.grad_params(); }

  void forward(const Batch& batch, ddp::ProcessGroup* /*peers*/) override {
    upload(gpu_, x_, batch.x);
    const float* out = model_.forward(x_.get(), batch.size);
    const bool labels = config_.task == Task::kClassification;
    if (labels) upload(gpu_, labels_, batch.labels);
    if (!labels) upload(gpu_, y_, batch.y);
    loss_.compute(config_.task, out, labels ? static_cast<const void*>(labels_.get()) : y_.get(),
                  batch.size, config_.output_dim, model_.output_grad());
  }
  LossResult loss() override { return loss_.result(); }
  void backward(ddp::GradAverager& sync, float scale, bool accumulate) override {
    // Device gradients are always a GradSync's (flags.cc refuses the shared sum with nccl).
    model_.backward(dynamic_cast<ddp::GradSync&>(sync), scale, accumulate);
  }
  void step(ddp::GradAverager& sync) override { optimizer_step(model_, opt_, sync); }

  // Device buffers only (ParamBuffer's contract with nccl): NCCL broadcasts
  // them in place on the device.
  void prepare(ddp::GradAverager& sync) override {
    sync.prepare(param_pointers(model_), opt_.state());
    opt_.reload_state();
  }

  std::vector<ddp::ParamBuffer> host_state() override {
    device_state_ = model_and_optimizer_state(model_, opt_);
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
    opt_.reload_state();
  }

 private:
  Config config_;
  int visible_;
  Gpu gpu_;
  DeviceMlp model_;
  DeviceLoss loss_;
  DeviceOptimizer opt_;
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
    *problem = std::string("no CUDA device is visible (cudaGetDeviceCount: ") +
               cudaGetErrorName(e) + ": " + cudaGetErrorString(e) + ")";
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
  std::string problem;  // none: the trainer asked gpu_problem(device) first
  return std::make_unique<GpuEngine>(config, dims, device, visible_devices(&problem));
}

}  // namespace train
