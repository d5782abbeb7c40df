#include "device_mlp.h"

#include <algorithm>
#include <utility>

#include "device_kernels.h"

namespace train {
namespace {

constexpr float kOne = 1.0f;
constexpr float kZero = 0.0f;

}  // namespace

DeviceMlp::DeviceMlp(std::vector<int> dims, std::uint64_t seed, const Gpu& gpu) : gpu_(gpu) {
  // The CPU model draws the initial weights (and checks dims): both paths
  // start from the same numbers.
  Mlp host(std::move(dims), seed);
  dims_ = host.dims();
  params_ = host.grad_params();
  for (auto& p : params_) p.device = gpu.device();
  for (std::size_t p = 0; p < host.num_tensors(); ++p) {
    DeviceArray<float> tensor(host.count(p));
    copy_to_device(gpu_, tensor.get(), host.data(p), tensor.bytes());
    tensors_.push_back(std::move(tensor));
  }
  act_.resize(static_cast<std::size_t>(num_layers()));
  check_cuda(cudaEventCreateWithFlags(&grads_done_, cudaEventDisableTiming), "cudaEventCreate");
}

DeviceMlp::~DeviceMlp() {
  if (grads_done_ != nullptr) (void)cudaEventDestroy(grads_done_);
}

std::size_t DeviceMlp::num_elements() const {
  std::size_t n = 0;
  for (const auto& t : tensors_) n += t.size();
  return n;
}

std::vector<void*> DeviceMlp::data_pointers() {
  std::vector<void*> out;
  for (auto& t : tensors_) out.push_back(t.get());
  return out;
}

float* DeviceMlp::forward(const float* x, int batch) {
  x_ = x;
  batch_ = batch;
  const cudaStream_t stream = gpu_.stream();
  const std::size_t rows = static_cast<std::size_t>(batch);
  const auto widest = static_cast<std::size_t>(*std::max_element(dims_.begin(), dims_.end()));
  dz_.reserve(rows * widest);
  dz_next_.reserve(rows * widest);
  if (ones_.size() < rows) {
    ones_ = DeviceArray<float>(rows);
    kernels::fill(ones_.get(), rows, 1.0f, stream);
  }
  const float* in = x;
  for (int l = 0; l < num_layers(); ++l) {
    const int n_in = dims_[l], n_out = dims_[l + 1];
    auto& out = act_[l];
    out.reserve(rows * n_out);
    const float* w = tensors_[2 * l].get();
    // out = in W^T [batch x n_out], i.e. column-major out^T = W in^T: W read
    // column-major is W^T (ld n_in), hence OP_T; in read column-major is in^T.
    check_cublas(cublas().sgemm(gpu_.blas(), CUBLAS_OP_T, CUBLAS_OP_N, n_out, batch, n_in, &kOne, w,
                                n_in, in, n_in, &kZero, out.get(), n_out),
                 "cublasSgemm (forward)");
    kernels::add_bias(out.get(), tensors_[2 * l + 1].get(), batch, n_out, l + 1 < num_layers(),
                      stream);
    in = out.get();
  }
  return act_.back().get();
}

void DeviceMlp::backward(GradSink& sink, float scale, bool accumulate) {
  const float beta = accumulate ? 1.0f : 0.0f;
  const int batch = batch_;
  const cudaStream_t stream = gpu_.stream();
  const cublasHandle_t blas = gpu_.blas();
  for (int l = num_layers() - 1; l >= 0; --l) {
    const int n_in = dims_[l], n_out = dims_[l + 1];
    const float* in = l == 0 ? x_ : act_[l - 1].get();
    // dLoss/db = scale * dz^T 1: dz read column-major is dz^T [n_out x batch].
    const std::size_t bias = 2 * static_cast<std::size_t>(l) + 1;
    check_cublas(cublas().sgemv(blas, CUBLAS_OP_N, n_out, batch, &scale, dz_.get(), n_out,
                                ones_.get(), 1, &beta, sink.grad(bias), 1),
                 "cublasSgemv (bias gradient)");
    // dLoss/dW = scale * dz^T in [n_out x n_in], i.e. column-major
    // dW^T [n_in x n_out] = scale * in^T dz: `in` as stored, dz transposed.
    const std::size_t weight = 2 * static_cast<std::size_t>(l);
    check_cublas(cublas().sgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, n_in, n_out, batch, &scale, in,
                                n_in, dz_.get(), n_out, &beta, sink.grad(weight), n_in),
                 "cublasSgemm (weight gradient)");
    check_cuda(cudaEventRecord(grads_done_, stream), "cudaEventRecord");
    if (l > 0) {
      // dLoss/din = dz W [batch x n_in], i.e. column-major din^T = W^T dz^T:
      // both as stored. Then through the ReLU of layer l-1's output.
      check_cublas(cublas().sgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, n_in, batch, n_out, &kOne,
                                  tensors_[weight].get(), n_in, dz_.get(), n_out, &kZero,
                                  dz_next_.get(), n_in),
                   "cublasSgemm (input gradient)");
      kernels::relu_backward(dz_next_.get(), in, static_cast<std::size_t>(batch) * n_in, stream);
    }
    // This layer's gradients are complete (the next one's input gradient
    // still runs): GradSync may hand them to NCCL.
    check_cuda(cudaEventSynchronize(grads_done_), "cudaEventSynchronize (gradients)");
    sink.ready(bias);
    sink.ready(weight);
    if (l == 0) break;
    std::swap(dz_, dz_next_);
  }
}

}  // namespace train
