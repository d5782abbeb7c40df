#include "flags.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>

#include "ddp/common/error.h"

namespace train {

const char* task_name(Task task) {
  return task == Task::kRegression ? "regression" : "classification";
}

const char* optimizer_name(OptimizerKind kind) {
  return kind == OptimizerKind::kSgd ? "sgd" : "adam";
}

namespace {

// CLI11's validators name the value but not always the flag; these name both.
// A number >= minimum (> 0 for positive_real).
template <typename T>
CLI::Validator at_least(T minimum, bool strict = false) {
  const std::string bound = fmt::format("{} {}", strict ? ">" : ">=", minimum);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        T value{};
        if (!CLI::detail::lexical_cast(text, value)) return "'" + text + "' is not a number";
        if (value < minimum || (strict && !(value > minimum)))
          return "must be " + bound + ", got " + text;
        return "";
      },
      bound);
}
CLI::Validator positive_real() { return at_least(0.0, true); }

// Checks that involve several flags; throws ddp::Error naming them.
void validate(const Config& c) {
  if (c.steps > 0 && c.epochs > 0) throw ddp::Error("give --steps or --epochs, not both");
  if (c.resume == "auto" && c.checkpoint.empty()) {
    throw ddp::Error("--resume auto needs --checkpoint PATH (the file it resumes from)");
  }
  if (c.optimizer == OptimizerKind::kSgd && (c.momentum < 0 || c.momentum >= 1)) {
    throw ddp::Error("--momentum must be in [0, 1), got " + std::to_string(c.momentum));
  }
  if (c.beta1 < 0 || c.beta1 >= 1 || c.beta2 < 0 || c.beta2 >= 1) {
    throw ddp::Error("--beta1 and --beta2 must be in [0, 1)");
  }
  if (c.task == Task::kClassification && c.output_dim < 2) {
    throw ddp::Error("--output_dim (the number of classes) must be >= 2 for --task classification");
  }
  if (c.comm_mode == "shared" && c.compression != "none") {
    throw ddp::Error("--compression " + c.compression +
                     " with --comm_mode shared: the shared sum puts nothing on a wire");
  }
}

}  // namespace

std::string gpu_path_missing() {
  return "this build of train has no GPU path (CUDA Toolkit, cuBLAS and NCCL were not all found "
         "at build time)";
}

std::string backend_problem(const Config& c, const std::string& backend, const std::string& named) {
  if (c.comm_mode == "shared" && (backend == "gloo" || backend == "nccl")) {
    return "--comm_mode shared with " + named +
           ": the shared sum needs the ranks' host memory in one node-shared segment (backend "
           "shm, or auto on one node)";
  }
  if (backend == "auto" || backend == "shm" || backend == "gloo") return "";
  if (backend != "nccl")
    return named + ": unknown backend: use auto, shm, gloo (CPU) or nccl (GPU)";
#ifndef DDP_TRAIN_GPU  // this build has no GPU engine (CMake found no CUDA, cuBLAS or NCCL)
  return named + ": " + gpu_path_missing() + ": use auto, shm or gloo";
#endif
  if (c.compression != "none") {
    return "--compression " + c.compression + " with " + named +
           ": GradSync compresses host buckets only (NCCL reduces device buckets in float32)";
  }
  if (c.shard_optimizer) {
    return "--shard_optimizer with " + named +
           ": ParamShards keeps parameters in host memory (the GPU path updates them on the "
           "device)";
  }
  return "";
}

namespace {

// What parse_flags reads back after parsing: the flags kept as text, and
// those --data digits must not be given.
struct FlagRefs {
  std::string optimizer = "sgd", task = "classification";
  CLI::Option *input_dim = nullptr, *output_dim = nullptr, *task_flag = nullptr,
              *dataset_size = nullptr;
};

// The run's length, batch and optimizer.
void add_run_flags(CLI::App& app, Config& c, FlagRefs& f) {
  const auto positive = at_least(1);
  app.add_option("--steps", c.steps, "Optimizer steps to run (or --epochs)")
      ->check(at_least<std::int64_t>(1));
  app.add_option("--epochs", c.epochs, "Epochs to run (default: 1 when --steps is not given)")
      ->check(at_least<std::int64_t>(1));
  app.add_option("--batch_size,--batch-size", c.batch_size, "Samples per rank per micro-batch")
      ->check(positive)
      ->capture_default_str();
  app.add_option("--accumulate", c.accumulate,
                 "Micro-batches per optimizer step; the first N-1 skip communication (no_sync)")
      ->check(positive)
      ->capture_default_str();
  app.add_option("--lr", c.lr, "Learning rate")->check(positive_real())->capture_default_str();
  app.add_option("--optimizer", f.optimizer, "sgd (with momentum) or adam")
      ->check(CLI::IsMember({"sgd", "adam"}))
      ->capture_default_str();
  app.add_option("--momentum", c.momentum, "SGD momentum (torch's rule, no dampening)")
      ->capture_default_str();
  app.add_option("--beta1", c.beta1, "Adam's first-moment decay")->capture_default_str();
  app.add_option("--beta2", c.beta2, "Adam's second-moment decay")->capture_default_str();
  app.add_option("--eps", c.eps, "Adam's epsilon")->check(positive_real())->capture_default_str();
}

// The model and the data.
void add_model_flags(CLI::App& app, Config& c, FlagRefs& f) {
  const auto positive = at_least(1);
  app.add_option("--hidden", c.hidden, "Width of the hidden layers")
      ->check(positive)
      ->capture_default_str();
  app.add_option("--layers", c.layers, "Hidden layers (the model has layers+1 Linear layers)")
      ->check(positive)
      ->capture_default_str();
  f.input_dim = app.add_option("--input_dim,--input-dim", c.input_dim, "Features per sample")
                    ->check(positive)
                    ->capture_default_str();
  f.output_dim =
      app.add_option("--output_dim,--output-dim", c.output_dim, "Classes, or regression targets")
          ->check(positive)
          ->capture_default_str();
  f.task_flag = app.add_option("--task", f.task,
                               "classification (cross-entropy) or regression (mean squared error)")
                    ->check(CLI::IsMember({"classification", "regression"}))
                    ->capture_default_str();
  app.add_option("--data", c.data,
                 "synthetic (made from --seed) or digits (scikit-learn's 8x8 handwritten digits: "
                 "64 features, 10 classes, 20% held out for a test accuracy at the end)")
      ->check(CLI::IsMember({"synthetic", "digits"}))
      ->capture_default_str();
  app.add_option("--data_file,--data-file", c.data_file,
                 "The digits' digits.csv.gz (Debian's python3-sklearn installs it)")
      ->capture_default_str();
  f.dataset_size = app.add_option("--dataset_size,--dataset-size", c.dataset_size,
                                  "Samples in the synthetic dataset")
                       ->check(at_least<std::int64_t>(1))
                       ->capture_default_str();
  app.add_option("--seed", c.seed, "Seeds the dataset, the initial weights and the shuffle")
      ->capture_default_str();
}

// Gradient averaging and the backend.
void add_sync_flags(CLI::App& app, Config& c) {
  app.add_option("--bucket_cap_mb,--bucket-cap-mb", c.bucket_cap_mb, "GradSync bucket size (MiB)")
      ->check(positive_real())
      ->capture_default_str();
  app.add_option("--compression", c.compression,
                 "Gradients on the wire: none, fp16 or bf16 (half the bytes; GradSync compression)")
      ->check(CLI::IsMember({"none", "fp16", "bf16"}))
      ->capture_default_str();
  app.add_option("--comm_mode,--comm-mode", c.comm_mode,
                 "How GradSync averages gradients: overlap (all-reduces on a communication "
                 "thread, beside the backward pass), inline (all-reduces on the compute thread, "
                 "between layers) or shared (no all-reduce: the ranks of one node add their "
                 "gradients into one node-shared sum as backward's GEMMs write them; shm only)")
      ->check(CLI::IsMember({"overlap", "inline", "shared"}))
      ->capture_default_str();
  app.add_flag("--shard_optimizer,--shard-optimizer", c.shard_optimizer,
               "ZeRO: each rank reduces the gradients of and updates its 1/N of the parameters, "
               "which are then all-gathered (ddp::ParamShards; same results; CPU only)");
  app.add_flag("--keep_denormals,--keep-denormals", c.keep_denormals,
               "Compute denormal floats as such on the CPU (IEEE gradual underflow, tens of times "
               "slower per operation on x86) instead of flushing them to zero");
  app.add_option("--backend", c.backend,
                 "Process group backend: auto, shm or gloo (math on the CPU), or nccl (math on "
                 "CUDA device LOCAL_RANK with cuBLAS; builds with CUDA and NCCL only) (default: "
                 "$DDP_BACKEND, else auto = shm with several ranks per node, else gloo)");
}

// Checkpoints and output.
void add_output_flags(CLI::App& app, Config& c) {
  const auto positive = at_least(1);
  app.add_option("--checkpoint", c.checkpoint, "Checkpoint file rank 0 writes (atomically)");
  app.add_option("--checkpoint_every,--checkpoint-every", c.checkpoint_every,
                 "Steps between checkpoints (0: only at the end)")
      ->check(at_least<std::int64_t>(0))
      ->capture_default_str();
  app.add_option(
      "--resume", c.resume,
      "Checkpoint to resume from; 'auto': --checkpoint when it exists, else start fresh");
  app.add_option("--sample_log,--sample-log", c.sample_log,
                 "Under ddprun --on_failure=heal: append each committed step's samples "
                 "(\"step S epoch E offset O count N\") to PATH.<rank>.<pid>, for checking "
                 "that no sample was lost or repeated");
  app.add_option("--log_every,--log-every", c.log_every, "Steps between progress lines")
      ->check(positive)
      ->capture_default_str();
}

}  // namespace

ParseResult parse_flags(const std::vector<std::string>& argv) {
  Config c;
  CLI::App app{
      "train: the reference data-parallel trainer. An MLP on a synthetic dataset (made from "
      "--seed) or scikit-learn's handwritten digits, forward and backward with OpenBLAS (or "
      "cuBLAS with --backend nccl), gradients averaged by ddp::GradSync while the backward pass "
      "runs. Launch with ddprun --nproc_per_node=N train [FLAGS].",
      "train"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.allow_extras();  // reported below, naming the first one
  app.get_formatter()->column_width(34);
  FlagRefs f;
  add_run_flags(app, c, f);
  add_model_flags(app, c, f);
  add_sync_flags(app, c);
  add_output_flags(app, c);

  std::vector<std::string> args(argv.begin() + (argv.empty() ? 0 : 1), argv.end());
  std::reverse(args.begin(), args.end());  // CLI11 takes a reversed vector
  try {
    app.parse(args);
    if (!app.remaining().empty()) {
      const std::string first = app.remaining().front();
      throw ddp::Error(first.size() > 1 && first[0] == '-'
                           ? "unknown option '" + first + "' (see train --help)"
                           : "unexpected argument '" + first + "' (see train --help)");
    }
    c.optimizer = f.optimizer == "adam" ? OptimizerKind::kAdam : OptimizerKind::kSgd;
    c.task = f.task == "regression" ? Task::kRegression : Task::kClassification;
    if (c.data == "digits") {
      // The file decides these: 64 pixels, 10 classes.
      for (const CLI::Option* o : {f.input_dim, f.output_dim, f.task_flag, f.dataset_size}) {
        if (o->count() > 0)
          throw ddp::Error(o->get_name() + " with --data digits: the digits' file fixes it");
      }
      c.input_dim = 64;
      c.output_dim = 10;
    }
    validate(c);
  } catch (const CLI::CallForHelp&) {
    return {std::nullopt, app.help(), 0};
  } catch (const std::runtime_error& e) {  // CLI::ParseError or ddp::Error
    return {std::nullopt, std::string("train: error: ") + e.what(), 2};
  }
  return {c, "", 0};
}

ddp::GradSyncOptions grad_sync_options(const Config& c) {
  ddp::GradSyncOptions sync_options;
  sync_options.bucket_cap_bytes = static_cast<std::size_t>(c.bucket_cap_mb * (1 << 20));
  // Backward multiplies by grad_scale() (GEMM alpha): the reduction is a plain sum.
  sync_options.prescaled_grads = true;
  sync_options.compression = c.compression == "fp16"   ? ddp::Compression::kFp16
                             : c.compression == "bf16" ? ddp::Compression::kBf16
                                                       : ddp::Compression::kNone;
  sync_options.comm_mode = c.comm_mode == "inline"   ? ddp::CommMode::kInline
                           : c.comm_mode == "shared" ? ddp::CommMode::kShared
                                                     : ddp::CommMode::kOverlap;
  sync_options.log_every = 0;  // GradSync reports its first 10 iterations; the summary has the rest
  return sync_options;
}

}  // namespace train
