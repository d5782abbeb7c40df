#pragma once
// The GPU path's CUDA kernels (device_kernels.cu, compiled by nvcc): the
// element-wise and per-row work around cuBLAS's GEMMs. Each launcher enqueues
// its kernel on `stream` and checks the launch (ddp::Error naming the kernel
// and the device). Matrices are row-major, one row per sample, as on the CPU;
// every pointer is device memory.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace train::kernels {

// x[k] = value.
void fill(float* x, std::size_t n, float value, cudaStream_t stream);

// out[i][j] += b[j] over rows x cols, then max(out, 0) when `relu`: a Linear
// layer's bias and activation after its GEMM.
void add_bias(float* out, const float* b, int rows, int cols, bool relu, cudaStream_t stream);

// The ReLU's backward: dz[k] = 0 where act[k] <= 0 (act: the ReLU's output).
void relu_backward(float* dz, const float* act, std::size_t n, cudaStream_t stream);

// Softmax cross-entropy, one thread per row (as loss.cc, in double):
// row_loss[i] = log(sum_j exp(z_ij - max_i)) - (z_i,label - max_i),
// row_correct[i] = (argmax_j z_ij == label_i), and
// dlogits[i][j] = (softmax_ij - [j == label_i]) / batch (may alias logits).
void cross_entropy(const float* logits, const std::int32_t* labels, int batch, int classes,
                   float* dlogits, double* row_loss, std::int32_t* row_correct,
                   cudaStream_t stream);

// Squared error, one thread per row: row_loss[i] = sum_j (y_ij - t_ij)^2 and
// dy = 2 (y - t) / (batch * dim) (torch's MSELoss, mean over every element).
void squared_error(const float* y, const float* target, int batch, int dim, float* dy,
                   double* row_loss, cudaStream_t stream);

// torch.optim.SGD (dampening 0): without momentum p -= lr g; with it
// buf = momentum buf + g, p -= lr buf.
void sgd(float* p, const float* g, std::size_t n, float lr, cudaStream_t stream);
void sgd_momentum(float* p, float* buf, const float* g, std::size_t n, float lr, float momentum,
                  cudaStream_t stream);

// torch.optim.Adam: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= step_size m / (sqrt(v) inv_bc2_sqrt + eps), where the host computed
// step_size = lr / (1 - b1^t) and inv_bc2_sqrt = 1 / sqrt(1 - b2^t).
void adam(float* p, float* m, float* v, const float* g, std::size_t n, float step_size,
          float inv_bc2_sqrt, float beta1, float beta2, float eps, cudaStream_t stream);

}  // namespace train::kernels
