#pragma once
// The GPU path's plumbing (built only with CUDA, cuBLAS and NCCL): checked
// CUDA and cuBLAS calls whose errors name the call and the device, owning
// buffers in device and pinned host memory, and Gpu, the device a rank
// computes on with its stream and cuBLAS handle.
//
// Every CUDA and cuBLAS call of the GPU path goes through check_cuda() or
// check_cublas(): a failure is a ddp::Error such as
//   cuda:1: cublasSgemm (forward, layer 2): CUBLAS_STATUS_EXECUTION_FAILED (...)

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

#include "ddp/common/error.h"

namespace train {

// The calling thread's current device, for error messages (-1 if unknown).
inline int current_device() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) return -1;
  return device;
}

inline std::string device_label(int device) {
  return device < 0 ? std::string("cuda:?") : "cuda:" + std::to_string(device);
}

// On `device` (default: the current one, looked up only on failure).
inline void check_cuda(cudaError_t e, const char* call, int device) {
  if (e == cudaSuccess) return;
  throw ddp::Error(device_label(device) + ": " + call + ": " + cudaGetErrorName(e) + " (" +
                   cudaGetErrorString(e) + ")");
}
inline void check_cuda(cudaError_t e, const char* call) {
  if (e != cudaSuccess) check_cuda(e, call, current_device());
}

// cuBLAS, loaded when the GPU path starts (dlopen of libcublas.so.<major>),
// not at program start: merely loading it costs ~150 MiB of resident memory
// (measured with CUDA 13), which CPU runs of the same program should not
// pay. The functions are cuBLAS's own, typed from cublas_v2.h.
struct Cublas {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasSgemm_v2) sgemm;
  decltype(&cublasSgemv_v2) sgemv;
  decltype(&cublasGetStatusName) status_name;
  decltype(&cublasGetStatusString) status_string;
};
// Loads cuBLAS on first use; throws ddp::Error naming the library and why.
const Cublas& cublas();

inline void check_cublas(cublasStatus_t s, const char* call) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw ddp::Error(device_label(current_device()) + ": " + call + ": " + cublas().status_name(s) +
                   " (" + cublas().status_string(s) + ")");
}

// A kernel launch: reports a bad configuration at once (asynchronous faults
// surface at the next checked synchronizing call).
inline void check_launch(const char* kernel) { check_cuda(cudaGetLastError(), kernel); }

// Where a CudaBuffer's memory comes from: the current device (zeroed), or
// page-locked host memory, which asynchronous copies from the device need so
// that they do not block the host.
struct DeviceMemory {
  static void* allocate(std::size_t bytes);
  static void release(void* p) noexcept { (void)cudaFree(p); }
};
struct PinnedMemory {
  static void* allocate(std::size_t bytes);
  static void release(void* p) noexcept { (void)cudaFreeHost(p); }
};

// `n` elements of T, owned.
template <typename T, typename Memory>
class CudaBuffer {
 public:
  CudaBuffer() = default;
  explicit CudaBuffer(std::size_t n)
      : p_(static_cast<T*>(Memory::allocate(n * sizeof(T)))), n_(n) {}
  ~CudaBuffer() {
    if (p_ != nullptr) Memory::release(p_);
  }
  CudaBuffer(CudaBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(o.n_) {}
  CudaBuffer& operator=(CudaBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;

  T* get() const { return p_; }
  std::size_t size() const { return n_; }
  std::size_t bytes() const { return n_ * sizeof(T); }
  // Grows (never shrinks) to at least n elements; the contents are lost.
  void reserve(std::size_t n) {
    if (n > n_) *this = CudaBuffer(n);
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

template <typename T>
using DeviceArray = CudaBuffer<T, DeviceMemory>;
template <typename T>
using PinnedArray = CudaBuffer<T, PinnedMemory>;

// The device one rank computes on: made current for this thread, with one
// stream for all of this rank's kernels, copies and GEMMs, and a cuBLAS
// handle bound to it. The stream is a blocking one (cudaStreamCreate), so it
// is ordered with the legacy default stream that GradSync's own cudaMemset
// and cudaMemcpy calls use; NCCL reduces on a non-blocking stream of its own,
// concurrently with it.
class Gpu {
 public:
  // REQUIRES: `device` is visible (see gpu_problem() in engine.h).
  explicit Gpu(int device);
  ~Gpu();
  Gpu(const Gpu&) = delete;
  Gpu& operator=(const Gpu&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t blas() const { return blas_; }
  // "cuda:0 (NVIDIA H100 80GB HBM3)".
  const std::string& name() const { return name_; }
  // Waits for everything enqueued on the stream; `what` names the caller.
  void synchronize(const char* what) const;

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::string name_;
};

// Host <-> device copies on the stream that wait for completion (checkpoints
// and set-up; not on the training step's path).
void copy_to_device(const Gpu& gpu, void* device, const void* host, std::size_t bytes);
void copy_to_host(const Gpu& gpu, void* host, const void* device, std::size_t bytes);

}  // namespace train
