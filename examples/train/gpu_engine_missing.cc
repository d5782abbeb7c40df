// The GPU path in a build without CUDA, cuBLAS or NCCL: only its refusal.
// (flags.cc already rejects --backend nccl in such a build; this keeps the
// program linkable without #ifdefs in trainer.cc.)

#include "ddp/common/error.h"
#include "engine.h"

namespace train {

std::string gpu_problem(int) { return gpu_path_missing(); }

std::unique_ptr<Engine> make_gpu_engine(const Config&, const std::vector<int>&, int) {
  throw ddp::Error(gpu_path_missing());
}

}  // namespace train
