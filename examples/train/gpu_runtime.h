#pragma once
// The CUDA plumbing of the GPU engine (gpu_engine.cc): cuBLAS loaded on
// first use, owned device and pinned host buffers, the device one rank
// computes on with its stream and cuBLAS handle, blocking copies and events.
// Every failure is a ddp::Error naming the call and the device (cuda_util.h).

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

#include "cuda_util.h"

namespace train {

// cuBLAS, loaded when the GPU engine starts (dlopen of libcublas.so.<major>),
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
// The soname first (the program's RUNPATH, LD_LIBRARY_PATH, ld.so.cache),
// then the library this program was built against. It stays loaded.
const Cublas& cublas();
// Throws ddp::Error naming `call`, the device and cuBLAS's status unless `s` is success.
void check_cublas(cublasStatus_t s, const char* call);

// `n` elements of T, owned: device memory (zeroed), or page-locked host
// memory, which asynchronous copies from the device need so that they do
// not block the host.
template <typename T, bool kPinned>
class CudaBuffer {
 public:
  CudaBuffer() = default;
  explicit CudaBuffer(std::size_t n) : n_(n) {
    void* p = nullptr;
    const std::size_t bytes = n == 0 ? 1 : n * sizeof(T);
    if (kPinned) {
      check_cuda(cudaMallocHost(&p, bytes), "cudaMallocHost");
    } else {
      check_cuda(cudaMalloc(&p, bytes), "cudaMalloc");
      if (const cudaError_t e = cudaMemset(p, 0, bytes); e != cudaSuccess) {
        (void)cudaFree(p);
        check_cuda(e, "cudaMemset");
      }
    }
    p_ = static_cast<T*>(p);
  }
  ~CudaBuffer() {
    if (p_ != nullptr) (void)(kPinned ? cudaFreeHost(p_) : cudaFree(p_));
  }
  CudaBuffer(CudaBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(o.n_) {}
  CudaBuffer& operator=(CudaBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }

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
using DeviceArray = CudaBuffer<T, false>;
template <typename T>
using PinnedArray = CudaBuffer<T, true>;

// The device one rank computes on: made current for this thread, with one
// stream for all of this rank's kernels, copies and GEMMs, and a cuBLAS
// handle bound to it. The stream is a blocking one (cudaStreamCreate), so it
// is ordered with the legacy default stream that GradSync's own cudaMemset
// and cudaMemcpy calls use; NCCL reduces on a non-blocking stream of its own.
class Gpu {
 public:
  explicit Gpu(int device);
  ~Gpu();
  Gpu(const Gpu&) = delete;
  Gpu& operator=(const Gpu&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t blas() const { return blas_; }
  const std::string& name() const { return name_; }  // "cuda:0 (NVIDIA H100 80GB HBM3)"

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

// A CUDA event, for waiting on part of the stream.
class Event {
 public:
  Event() { check_cuda(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming), "cudaEventCreate"); }
  ~Event() { (void)cudaEventDestroy(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(cudaStream_t stream) { check_cuda(cudaEventRecord(e_, stream), "cudaEventRecord"); }
  void wait(const char* what) {
    check_cuda(cudaEventSynchronize(e_),
               (std::string("cudaEventSynchronize (") + what + ")").c_str());
  }

 private:
  cudaEvent_t e_ = nullptr;
};

}  // namespace train
