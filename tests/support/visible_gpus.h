#pragma once
// Test support: how many CUDA devices this process sees (0 without NCCL/CUDA
// in the build, or without a driver). GPU tests skip with a reason when 0.

#ifdef DDP_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace ddp::testing {

inline int visible_gpus() {
#ifdef DDP_HAVE_NCCL
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
#else
  return 0;
#endif
}

}  // namespace ddp::testing
