// gradsync_bench --device in a build without CUDA, NCCL or cuBLAS.

#include "ddp/common/error.h"
#include "gradsync_bench_device.h"

namespace bench {

int run_gradsync_device_bench(const GradSyncBenchConfig&) {
  throw ddp::Error(
      "--device: this gradsync_bench was built without CUDA, NCCL and cuBLAS (install the CUDA "
      "toolkit and NCCL under /usr/local/cuda and build again)");
}

}  // namespace bench
