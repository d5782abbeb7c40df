#pragma once
// CUDA device memory for libddp (internal): the one place that allocates,
// zeroes and copies it. The nccl backend's allocate() is allocate_device()
// on the rank's device; GradSync's device buckets come from that allocate()
// (or, in a world of one, where the group has no nccl backend, from
// allocate_device() directly). Without CUDA (no DDP_HAVE_NCCL) every
// function but check_cuda throws ddp::Error saying so.

#include <cstddef>
#include <memory>

#ifdef DDP_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace ddp::device {

#ifdef DDP_HAVE_NCCL
// Throws ddp::Error "cuda: <what>: <CUDA's message>" unless e is cudaSuccess.
void check_cuda(cudaError_t e, const char* what);
#endif

// Makes `device` the calling thread's current CUDA device for the scope,
// restoring the previous one after. Does nothing without CUDA.
class Scope {
 public:
  explicit Scope(int device);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  int previous_ = -1;
};

// `bytes` of memory on CUDA device `device` (cudaMalloc: 256-byte aligned; a
// byte when bytes is 0), freed with the last reference. The caller's current
// device is kept.
std::shared_ptr<void> allocate(std::size_t bytes, int device);
// Zeroes device memory and waits for it (default stream).
void zero(void* p, std::size_t bytes);
// Copies between any two of host and device memory and waits for it.
void copy(void* dst, const void* src, std::size_t bytes);

}  // namespace ddp::device
