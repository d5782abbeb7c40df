#pragma once
// Test support: what the GPU tests of the reference trainer can do here,
// asked of the trainer itself (the test binaries do not link CUDA): one short
// `--backend nccl` run as a world of one, without ddprun.

#include <string>

#include "subprocess.h"

namespace ddp::testing {

struct GpuProbe {
  bool built = false;  // the trainer has its GPU path (CUDA, cuBLAS and NCCL at build time)
  int gpus = 0;        // CUDA devices it sees
  std::string reason;  // why GPU runs cannot happen here ("" when they can)
  ProcessResult run;
};

inline constexpr const char* kGpuProbeFailed = "the probe run of train --backend nccl failed";

// `trainer`: train, or a program that takes train's flags (heal_fault_worker).
// Probed once per program and process.
const GpuProbe& train_gpu_probe(const std::string& trainer);

}  // namespace ddp::testing

// Skips the test unless `n` GPUs are visible to `trainer`, printing why; a
// probe run that failed for another reason fails the test.
#define REQUIRE_TRAIN_GPUS(trainer, n)                                                \
  do {                                                                                \
    const ::ddp::testing::GpuProbe& probe = ::ddp::testing::train_gpu_probe(trainer); \
    ASSERT_TRUE(probe.reason != ::ddp::testing::kGpuProbeFailed)                      \
        << probe.run.out << probe.run.err;                                            \
    if (probe.gpus < (n)) {                                                           \
      GTEST_SKIP() << "needs " << (n) << " GPU(s): "                                  \
                   << (probe.reason.empty() ? std::to_string(probe.gpus) + " visible" \
                                            : probe.reason);                          \
    }                                                                                 \
  } while (0)
