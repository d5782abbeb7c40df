#include "flags.h"

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

// CLI11's validators name the value but not always the flag; this one does both.
template <typename T>
CLI::Validator at_least(T minimum) {
  return CLI::Validator(
      [minimum](std::string& text) -> std::string {
        T value{};
        if (!CLI::detail::lexical_cast(text, value)) return "'" + text + "' is not a number";
        if (value < minimum) return "must be >= " + std::to_string(minimum) + ", got " + text;
        return "";
      },
      ">= " + std::to_string(minimum));
}

CLI::Validator positive_real() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "'" + text + "' is not a number";
        if (!(value > 0)) return "must be > 0, got " + text;
        return "";
      },
      "> 0");
}

}  // namespace

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
  if (c.exchange == "activations") {
    // GradSync's gradient options have no gradients to act on in this mode.
    if (c.shard_optimizer) {
      throw ddp::Error(
          "--shard_optimizer with --exchange activations: the exchange already shards the "
          "optimizer (the ranks update the weights' rows in units, one copy per node); give one "
          "of them");
    }
    if (c.compression != "none") {
      throw ddp::Error("--compression " + c.compression +
                       " with --exchange activations: no gradients go between the ranks");
    }
  }
  if (c.comm_mode == "shared") {
    if (c.exchange == "activations") {
      throw ddp::Error(
          "--comm_mode shared with --exchange activations: the exchange moves no gradients "
          "(GradSync is left out of its backward pass); give one of them");
    }
    if (c.compression != "none") {
      throw ddp::Error("--compression " + c.compression +
                       " with --comm_mode shared: the shared sum puts nothing on a wire");
    }
  }
  if (!c.backend.empty()) {
    if (auto problem = backend_problem(c, c.backend, "--backend " + c.backend); !problem.empty())
      throw ddp::Error(problem);
  }
}

bool gpu_path_built() {
#ifdef DDP_TRAIN_GPU
  return true;
#else
  return false;
#endif
}

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
  if (!gpu_path_built()) return named + ": " + gpu_path_missing() + ": use auto, shm or gloo";
  if (c.compression != "none") {
    return "--compression " + c.compression + " with " + named +
           ": GradSync compresses host buckets only (NCCL reduces device buckets in float32)";
  }
  if (c.exchange == "activations") {
    return "--exchange activations with " + named +
           ": the ranks share host memory (the GPU path exchanges gradients with NCCL)";
  }
  if (c.shard_optimizer) {
    return "--shard_optimizer with " + named +
           ": ParamShards keeps parameters in host memory (the GPU path updates them on the device)";
  }
  return "";
}

ParseResult parse_flags(const std::vector<std::string>& argv) {
  Config c;
  CLI::App app{
      "train: the reference data-parallel trainer. An MLP on a synthetic dataset (made from "
      "--seed), forward and backward with OpenBLAS (or cuBLAS with --backend nccl), gradients "
      "averaged by ddp::GradSync while the backward pass runs. Launch with ddprun "
      "--nproc_per_node=N train [FLAGS].",
      "train"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.allow_extras();  // reported below, naming the first one
  app.get_formatter()->column_width(34);

  app.add_option("--steps", c.steps, "Optimizer steps to run (or --epochs)")
      ->check(at_least<std::int64_t>(1));
  app.add_option("--epochs", c.epochs, "Epochs to run (default: 1 when --steps is not given)")
      ->check(at_least<std::int64_t>(1));
  app.add_option("--batch_size,--batch-size", c.batch_size, "Samples per rank per micro-batch")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("--accumulate", c.accumulate,
                 "Micro-batches per optimizer step; the first N-1 skip communication (no_sync)")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("--lr", c.lr, "Learning rate")->check(positive_real())->capture_default_str();
  std::string optimizer = "sgd";
  app.add_option("--optimizer", optimizer, "sgd (with momentum) or adam")
      ->check(CLI::IsMember({"sgd", "adam"}))
      ->capture_default_str();
  app.add_option("--momentum", c.momentum, "SGD momentum (torch's rule, no dampening)")
      ->capture_default_str();
  app.add_option("--beta1", c.beta1, "Adam's first-moment decay")->capture_default_str();
  app.add_option("--beta2", c.beta2, "Adam's second-moment decay")->capture_default_str();
  app.add_option("--eps", c.eps, "Adam's epsilon")->check(positive_real())->capture_default_str();
  app.add_option("--hidden", c.hidden, "Width of the hidden layers")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("--layers", c.layers,
                 "Number of hidden layers (the model has layers+1 Linear layers)")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("--input_dim,--input-dim", c.input_dim, "Features per sample")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("--output_dim,--output-dim", c.output_dim, "Classes, or regression targets")
      ->check(at_least(1))
      ->capture_default_str();
  std::string task = "classification";
  app.add_option("--task", task,
                 "classification (cross-entropy) or regression (mean squared error)")
      ->check(CLI::IsMember({"classification", "regression"}))
      ->capture_default_str();
  app.add_option("--dataset_size,--dataset-size", c.dataset_size,
                 "Samples in the synthetic dataset")
      ->check(at_least<std::int64_t>(1))
      ->capture_default_str();
  app.add_option("--seed", c.seed, "Seeds the dataset, the initial weights and the shuffle")
      ->capture_default_str();
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
               "which are then all-gathered (with shm: one copy per node, nothing to gather) "
               "(ddp::ParamShards; same results, less memory traffic)");
  app.add_option("--exchange", c.exchange,
                 "What goes between the ranks: gradients (GradSync's all-reduce) or activations "
                 "(every rank's layer inputs and output gradients, in memory the node's ranks "
                 "share; the ranks compute and update the weight gradients' rows in units that "
                 "whichever rank is free claims: the same update, far less traffic; one node "
                 "with shm)")
      ->check(CLI::IsMember({"gradients", "activations"}))
      ->capture_default_str();
  app.add_option("--backend", c.backend,
                 "Process group backend: auto, shm or gloo (math on the CPU), or nccl (math on "
                 "CUDA device LOCAL_RANK with cuBLAS; builds with CUDA and NCCL only) (default: "
                 "$DDP_BACKEND, else auto = shm with several ranks per node, else gloo)");
  app.add_option("--checkpoint", c.checkpoint, "Checkpoint file rank 0 writes (atomically)");
  app.add_option("--checkpoint_every,--checkpoint-every", c.checkpoint_every,
                 "Steps between checkpoints (0: only at the end)")
      ->check(at_least<std::int64_t>(0))
      ->capture_default_str();
  app.add_option(
      "--resume", c.resume,
      "Checkpoint to resume from; 'auto': --checkpoint when it exists, else start fresh");
  app.add_option("--log_every,--log-every", c.log_every, "Steps between progress lines")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("--progress", c.progress, "auto (a live bar on a terminal), bar, or lines")
      ->check(CLI::IsMember({"auto", "bar", "lines"}))
      ->capture_default_str();
  app.add_option("--crash_at_step,--crash-at-step", c.crash_at_step,
                 "Testing: the last rank SIGKILLs itself after this step (first attempt only)")
      ->check(at_least<std::int64_t>(0));
  app.add_option("--stall_at_step,--stall-at-step", c.stall_at_step,
                 "Testing: the last rank stops itself (SIGSTOP) after this step (first attempt "
                 "only): alive but silent, as a hung rank is")
      ->check(at_least<std::int64_t>(0));

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
    c.optimizer = optimizer == "adam" ? OptimizerKind::kAdam : OptimizerKind::kSgd;
    c.task = task == "regression" ? Task::kRegression : Task::kClassification;
    validate(c);
  } catch (const CLI::CallForHelp&) {
    return {std::nullopt, app.help(), 0};
  } catch (const CLI::ParseError& e) {
    return {std::nullopt, std::string("train: error: ") + e.what(), 2};
  } catch (const ddp::Error& e) {
    return {std::nullopt, std::string("train: error: ") + e.what(), 2};
  }
  return {c, "", 0};
}

}  // namespace train
