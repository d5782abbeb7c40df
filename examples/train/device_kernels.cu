// The GPU engine's kernels (see device_kernels.h). Element-wise kernels use a
// grid-stride loop over at most kMaxBlocks blocks of kThreads; the per-row
// losses give each row one thread (the trainer's outputs are a few classes or
// targets wide).

#include "cuda_util.h"
#include "device_kernels.h"
#include "loss.h"

namespace train::kernels {
namespace {

constexpr int kThreads = 256;
constexpr std::size_t kMaxBlocks = 4096;

unsigned blocks_for(std::size_t n) {
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks == 0 ? 1 : blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

__device__ std::size_t first_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ std::size_t stride() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

__global__ void add_bias_kernel(float* out, const float* b, std::size_t n, int cols, bool relu) {
  for (std::size_t k = first_index(); k < n; k += stride()) {
    const float v = out[k] + b[k % static_cast<std::size_t>(cols)];
    out[k] = relu ? fmaxf(v, 0.0f) : v;
  }
}

__global__ void relu_backward_kernel(float* dz, const float* act, std::size_t n) {
  for (std::size_t k = first_index(); k < n; k += stride()) {
    if (!(act[k] > 0.0f)) dz[k] = 0.0f;
  }
}

__global__ void cross_entropy_kernel(const float* logits, const std::int32_t* labels, int batch,
                                     int classes, float* dlogits, double* row_loss,
                                     std::int32_t* row_correct) {
  const std::size_t i = first_index();
  if (i >= static_cast<std::size_t>(batch)) return;
  const std::size_t row = i * static_cast<std::size_t>(classes);
  bool correct = false;
  row_loss[i] = cross_entropy_row(logits + row, labels[i], classes,
                                  1.0f / static_cast<float>(batch), dlogits + row, &correct);
  row_correct[i] = correct ? 1 : 0;
}

__global__ void squared_error_kernel(const float* y, const float* target, int batch, int dim,
                                     float* dy, double* row_loss, float scale) {
  const std::size_t i = first_index();
  if (i >= static_cast<std::size_t>(batch)) return;
  double total = 0;
  for (std::size_t k = i * dim; k < (i + 1) * dim; ++k) {
    const float d = y[k] - target[k];
    total += static_cast<double>(d) * d;
    dy[k] = scale * d;
  }
  row_loss[i] = total;
}

__global__ void sgd_kernel(float* p, float* buf, const float* g, std::size_t n, float lr,
                           float momentum) {
  for (std::size_t k = first_index(); k < n; k += stride()) {
    if (buf == nullptr) {
      p[k] -= lr * g[k];
    } else {
      buf[k] = momentum * buf[k] + g[k];
      p[k] -= lr * buf[k];
    }
  }
}

__global__ void adam_kernel(float* p, float* m, float* v, const float* g, std::size_t n,
                            float step_size, float inv_bc2_sqrt, float b1, float b2, float eps) {
  for (std::size_t k = first_index(); k < n; k += stride()) {
    m[k] = b1 * m[k] + (1.0f - b1) * g[k];
    v[k] = b2 * v[k] + (1.0f - b2) * g[k] * g[k];
    p[k] -= step_size * m[k] / (sqrtf(v[k]) * inv_bc2_sqrt + eps);
  }
}

}  // namespace

void add_bias(float* out, const float* b, int rows, int cols, bool relu, cudaStream_t stream) {
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  add_bias_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, b, n, cols, relu);
  check_launch("add_bias kernel");
}

void relu_backward(float* dz, const float* act, std::size_t n, cudaStream_t stream) {
  relu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dz, act, n);
  check_launch("relu_backward kernel");
}

void cross_entropy(const float* logits, const std::int32_t* labels, int batch, int classes,
                   float* dlogits, double* row_loss, std::int32_t* row_correct,
                   cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((batch + kThreads - 1) / kThreads);
  cross_entropy_kernel<<<blocks, kThreads, 0, stream>>>(logits, labels, batch, classes, dlogits,
                                                        row_loss, row_correct);
  check_launch("cross_entropy kernel");
}

void squared_error(const float* y, const float* target, int batch, int dim, float* dy,
                   double* row_loss, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((batch + kThreads - 1) / kThreads);
  const float scale =
      2.0f / static_cast<float>(static_cast<std::size_t>(batch) * static_cast<std::size_t>(dim));
  squared_error_kernel<<<blocks, kThreads, 0, stream>>>(y, target, batch, dim, dy, row_loss, scale);
  check_launch("squared_error kernel");
}

void sgd(float* p, float* buf, const float* g, std::size_t n, float lr, float momentum,
         cudaStream_t stream) {
  sgd_kernel<<<blocks_for(n), kThreads, 0, stream>>>(p, buf, g, n, lr, momentum);
  check_launch("sgd kernel");
}

void adam(float* p, float* m, float* v, const float* g, std::size_t n, float step_size,
          float inv_bc2_sqrt, float beta1, float beta2, float eps, cudaStream_t stream) {
  adam_kernel<<<blocks_for(n), kThreads, 0, stream>>>(p, m, v, g, n, step_size, inv_bc2_sqrt, beta1,
                                                      beta2, eps);
  check_launch("adam kernel");
}

}  // namespace train::kernels
