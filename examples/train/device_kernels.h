#pragma once
// The GPU engine's CUDA kernels (device_kernels.cu, compiled by nvcc): the
// element-wise and per-row work around cuBLAS's GEMMs, with the CPU engine's
// arithmetic. Each function enqueues its kernel on `stream` and checks the
// launch (ddp::Error naming the kernel and the device). Matrices are
// row-major, one row per sample, as on the CPU; every pointer is device memory.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace train::kernels {

// out[i][j] += b[j] over rows x cols, then max(out, 0) when `relu`: a Linear
// layer's bias and activation after its GEMM.
void add_bias(float* out, const float* b, int rows, int cols, bool relu, cudaStream_t stream);

// The ReLU's backward: dz[k] = 0 where act[k] <= 0 (act: the ReLU's output).
void relu_backward(float* dz, const float* act, std::size_t n, cudaStream_t stream);

// loss.h's losses, one thread per row, leaving each row's loss (and for
// cross-entropy whether its argmax is the label) for the host to sum.
void cross_entropy(const float* logits, const std::int32_t* labels, int batch, int classes,
                   float* dlogits, double* row_loss, std::int32_t* row_correct,
                   cudaStream_t stream);
void squared_error(const float* y, const float* target, int batch, int dim, float* dy,
                   double* row_loss, cudaStream_t stream);

// optimizer.h's rules: SGD (buf: the momentum buffer, or null without
// momentum), and Adam with step_size = lr / (1 - b1^t) and
// inv_bc2_sqrt = 1 / sqrt(1 - b2^t) computed by the host.
void sgd(float* p, float* buf, const float* g, std::size_t n, float lr, float momentum,
         cudaStream_t stream);
void adam(float* p, float* m, float* v, const float* g, std::size_t n, float step_size,
          float inv_bc2_sqrt, float beta1, float beta2, float eps, cudaStream_t stream);

}  // namespace train::kernels
