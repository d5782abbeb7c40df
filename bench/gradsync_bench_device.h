#pragma once
// gradsync_bench --device: GradSync with device buckets (NCCL) against the
// same training step with no gradient sync, on the CUDA device LOCAL_RANK.

#include "gradsync_bench_options.h"

namespace bench {

// Run under ddprun with DDP_BACKEND=nccl (every rank calls it). Rank 0
// prints the table to stdout. Returns the exit code; throws ddp::Error naming
// what failed (no CUDA device, another backend, a CUDA or cuBLAS call), and
// throws at once in a build without CUDA and cuBLAS.
int run_gradsync_device_bench(const GradSyncBenchConfig& config);

}  // namespace bench
