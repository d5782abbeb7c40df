#pragma once
// gradsync_bench's command line: what to measure and how long. Pure (no
// process group, no I/O), so its checks are unit-tested.

#include <string>
#include <vector>

#include "ddp/grad_averager.h"

namespace bench {

struct GradSyncBenchConfig {
  int layers = 4;
  int width = 888;
  int batch = 64;  // rows per rank and step
  int rounds = 5;  // configurations are measured in turn, `rounds` times (drift cancels out)
  int steps = 8;   // measured steps per configuration and round
  int warmup = 5;
  // 0: one bucket for everything, reduced when the backward pass ends (no overlap).
  std::vector<double> caps_mib = {1, 4, 25, 100, 0};
  std::vector<double> inline_caps_mib = {4, 25};  // the same, with CommMode::kInline
  bool shared = true;                             // also CommMode::kShared (no buckets)
  double shared_block_kib = 256;
  double first_mib = 1;
  ddp::Compression compression = ddp::Compression::kNone;
  // The model, gradients and buckets on the CUDA device LOCAL_RANK (cuBLAS,
  // NCCL); then the model's defaults are larger (kDevice*) and the shared
  // sum and compression, which are host-only, are not run.
  bool device = false;
};

// The device run's model when --layers/--width/--batch are not given: 8 x
// 4096 (134M parameters, 537 MB of float32 gradients), batch 512, enough
// work per layer for a GPU to overlap the all-reduces with.
inline constexpr int kDeviceLayers = 8;
inline constexpr int kDeviceWidth = 4096;
inline constexpr int kDeviceBatch = 512;

struct GradSyncBenchArgs {
  GradSyncBenchConfig config;
  bool help = false;  // --help: print usage(), exit 0
  std::string error;  // non-empty: what is wrong, naming the flag (exit 64)
};

// argv[1..argc) as `--flag value` pairs, plus --device and --help alone.
GradSyncBenchArgs parse_gradsync_bench_args(int argc, const char* const* argv);
std::string gradsync_bench_usage();

}  // namespace bench
