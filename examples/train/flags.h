#pragma once
// The trainer's command line: every flag, its default, and the checks that
// turn a bad value into one line naming the flag (exit code 2).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/grad_averager.h"

namespace train {

enum class Task : int { kRegression, kClassification };
enum class OptimizerKind : int { kSgd, kAdam };

const char* task_name(Task task);                // "regression", "classification"
const char* optimizer_name(OptimizerKind kind);  // "sgd", "adam"

// Where Debian's python3-sklearn installs scikit-learn's handwritten digits.
inline constexpr const char* kDigitsFile =
    "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";

struct Config {
  // Length of the run: exactly one of them (neither: 1 epoch). An epoch is
  // DataPlan::steps_per_epoch() optimizer steps (see data.h).
  std::int64_t steps = 0;
  std::int64_t epochs = 0;
  int batch_size = 32;  // samples per rank per micro-batch
  int accumulate = 1;   // micro-batches per optimizer step (the first N-1 without communication)

  // Model: input_dim -> `layers` hidden layers of `hidden` (ReLU) -> output_dim.
  int input_dim = 32;
  int hidden = 128;
  int layers = 2;
  int output_dim = 10;  // classes (classification) or target values (regression)

  // The data: "synthetic" (made from the seed) or "digits" (data_file; its
  // shape sets input_dim 64, output_dim 10 and classification).
  std::string data = "synthetic";
  std::string data_file = kDigitsFile;
  Task task = Task::kClassification;
  std::int64_t dataset_size = 8192;  // synthetic only
  std::uint64_t seed = 0;

  OptimizerKind optimizer = OptimizerKind::kSgd;
  double lr = 0.05;
  double momentum = 0.9;                          // sgd only
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam only

  double bucket_cap_mb = 25;
  std::string compression = "none";   // gradients on the wire: none, fp16, bf16
  std::string comm_mode = "overlap";  // GradSync's CommMode: overlap, inline, shared
  // ZeRO stage 1 (ddp::ParamShards): each rank updates only its shard of the
  // parameters (and keeps only that shard's optimizer state current), then
  // the shards are all-gathered. Same results; CPU engine only.
  bool shard_optimizer = false;
  // "" : $DDP_BACKEND, else auto (shm with several local ranks, else gloo: the
  // CPU engine); nccl: the GPU engine (math on CUDA device LOCAL_RANK).
  std::string backend;
  // IEEE gradual underflow on the CPU: denormal floats are computed as such
  // (slowly) instead of flushed to zero (float_mode.h).
  bool keep_denormals = false;

  std::string checkpoint;               // "" : no checkpoints
  std::int64_t checkpoint_every = 100;  // steps; 0: only at the end
  std::string resume;                   // "" : fresh; "auto": --checkpoint if it exists
  int log_every = 10;
  std::string sample_log;  // heal mode: where each process records its committed steps
};

struct ParseResult {
  std::optional<Config> config;  // set when training should run
  std::string text;              // help text, or the one-line error
  int exit_code = 0;             // when config is empty: 0 (help) or 2 (bad flags)
};

// Parses argv (argv[0] is the program). Never throws.
ParseResult parse_flags(const std::vector<std::string>& argv);

// GradSync's options from the flags (--bucket_cap_mb, --compression,
// --comm_mode); gradients arrive prescaled (the backward pass multiplies).
ddp::GradSyncOptions grad_sync_options(const Config& config);

// Why a build without the GPU engine (--backend nccl; CUDA, cuBLAS and NCCL
// were not all found at build time) refuses it.
std::string gpu_path_missing();
// "" when this build trains with `backend` and config's other flags; else
// the problem, naming the backend as `named` ("--backend nccl", "DDP_BACKEND=nccl").
std::string backend_problem(const Config& config, const std::string& backend,
                            const std::string& named);

}  // namespace train
