#pragma once
// Checked CUDA calls, for the GPU engine (gpu_engine.cc) and its kernels
// (device_kernels.cu): a failure is a ddp::Error naming the call and the
// device, e.g. "cuda:1: cudaMemcpyAsync (batch to device): cudaErrorIllegalAddress (...)".

#include <cuda_runtime.h>

#include <string>

#include "ddp/common/error.h"

namespace train {

inline std::string device_label(int device) {
  return device < 0 ? std::string("cuda:?") : "cuda:" + std::to_string(device);
}

// `device` -2: the calling thread's current one (looked up only on failure).
inline void check_cuda(cudaError_t e, const char* call, int device = -2) {
  if (e == cudaSuccess) return;
  if (device == -2 && cudaGetDevice(&device) != cudaSuccess) device = -1;
  throw ddp::Error(device_label(device) + ": " + call + ": " + cudaGetErrorName(e) + " (" +
                   cudaGetErrorString(e) + ")");
}

// A kernel launch: reports a bad configuration at once (asynchronous faults
// surface at the next checked synchronizing call).
inline void check_launch(const char* kernel) { check_cuda(cudaGetLastError(), kernel); }

}  // namespace train
