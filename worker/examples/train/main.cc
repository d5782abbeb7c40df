// train: the reference data-parallel trainer.
//
//   ddprun --nproc_per_node=4 build/worker/examples/train --steps 300 --lr 0.05
//
// Every rank builds the same synthetic dataset and MLP from --seed, reads its
// part of each global batch (data_plan.h), runs forward and backward — on the
// CPU with OpenBLAS (one thread), or with --backend nccl on CUDA device
// LOCAL_RANK with cuBLAS (engine.h) — and writes each layer's gradients
// straight into ddp::GradSync's bucket views, last layer first, marking each
// ready at once: a bucket's all-reduce runs on the group's thread while the
// layers below are still being differentiated. finish() leaves the averaged
// gradients in the views and every rank applies the same optimizer step.
// See README.md ("The reference trainer") for the flags and the choices.

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "data_plan.h"
#include "dataset.h"
#include "ddp/ddp.h"
#include "ddp/grad_sync.h"
#include "ddp/log.h"
#include "ddp/metrics.h"
#include "engine.h"
#include "flags.h"
#include "progress.h"

namespace train {
namespace {

using Clock = std::chrono::steady_clock;

// A problem with the flags found after parsing (needs the world size): exit 2.
struct FlagError : ddp::Error {
  using ddp::Error::Error;
};

// Backward's gradients go straight into GradSync's bucket views.
class GradSyncSink final : public GradSink {
 public:
  explicit GradSyncSink(ddp::GradSync& sync) : sync_(sync) {}
  float* grad(std::size_t param) override { return sync_.grad_view(param); }
  void ready(std::size_t param) override { sync_.mark_ready(param); }
  bool sums_in_place() const override { return sync_.comm_mode() == ddp::CommMode::kShared; }
  void contribute(std::size_t param,
                  const std::function<void(const ddp::GradBlock&)>& write) override {
    sync_.contribute(param, write);
  }

 private:
  ddp::GradSync& sync_;
};

std::string choose_backend(const Config& c) {
  std::string backend = c.backend;  // already checked by validate()
  std::string named = "--backend " + backend;
  if (backend.empty()) {
    const char* env = std::getenv("DDP_BACKEND");
    backend = env != nullptr && *env != '\0' ? env : "auto";
    named = "DDP_BACKEND=" + backend;
    if (auto problem = backend_problem(c, backend, named); !problem.empty())
      throw FlagError(problem);
  }
  // auto means the CPU: shared memory among the ranks of a node (Gloo across
  // nodes). The GPU path is asked for by name.
  if (backend == "auto") backend = ddp::cpu_backend();
  if (backend == "nccl") {
    if (auto problem = gpu_problem(ddp::local_rank()); !problem.empty())
      throw FlagError(named + ": " + problem);
  }
  return backend;
}

std::string dims_text(const std::vector<int>& dims) {
  std::string text;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) text += '-';
    text += std::to_string(dims[i]);
  }
  return text;
}

// What a checkpoint says about the run that wrote it.
CheckpointMeta describe_run(const Config& c, const std::vector<int>& dims, std::int64_t step,
                            std::int64_t epoch, std::int64_t global_batch, int world) {
  return {{"step", std::to_string(step)},
          {"epoch", std::to_string(epoch)},
          {"model", dims_text(dims)},
          {"task", task_name(c.task)},
          {"optimizer", optimizer_name(c.optimizer)},
          {"seed", std::to_string(c.seed)},
          {"dataset_size", std::to_string(c.dataset_size)},
          {"global_batch", std::to_string(global_batch)},
          {"world_size", std::to_string(world)},
          // Nothing random happens during training: the data order is a
          // function of (seed, epoch) and the position in it of the step.
          {"rng", "none"}};
}

// Rank 0 reads the checkpoint into the model and optimizer state; every rank
// learns the outcome (a failure is raised on every rank, not only on rank 0).
// Returns the step to continue from (0: a fresh start).
std::int64_t resume(const Config& c, Engine& engine, ddp::ProcessGroup& pg,
                    std::int64_t global_batch, std::string* from) {
  if (c.resume.empty()) return 0;
  std::string status;
  if (pg.rank() == 0) {
    std::string path = c.resume == "auto" ? c.checkpoint : c.resume;
    try {
      if (c.resume == "auto" && !std::filesystem::exists(path)) {
        status = "fresh";
      } else {
        // Compare what can be told apart by name first, for a clear message.
        CheckpointMeta meta = load_checkpoint(path, engine.host_state());
        const CheckpointMeta mine = describe_run(c, engine.dims(), 0, 0, global_batch, pg.size());
        for (const char* key : {"model", "task", "optimizer"}) {
          if (meta[key] != mine.at(key)) {
            throw ddp::Error("checkpoint " + path + " was written for " + key + " " + meta[key] +
                             ", this run has " + mine.at(key));
          }
        }
        for (const char* key : {"seed", "dataset_size", "global_batch"}) {
          if (meta[key] != mine.at(key)) {
            ddp::log::warn(
                "checkpoint {} was written with {} {}, this run has {}: the data order "
                "differs from the original run's",
                path, key, meta[key], mine.at(key));
          }
        }
        engine.load_host_state();
        status = "ok " + meta["step"] + " " + path;
      }
    } catch (const ddp::Error& e) {
      status = std::string("error ") + e.what();
    }
  }
  pg.broadcast_object(status, 0);
  if (status == "fresh") {
    ddp::log::info("no checkpoint at {} yet: starting from step 0", c.checkpoint);
    return 0;
  }
  if (status.rfind("error ", 0) == 0) {
    throw ddp::Error("--resume: " + status.substr(6) + (pg.rank() == 0 ? "" : " (on rank 0)"));
  }
  const auto space = status.find(' ', 3);
  *from = status.substr(space + 1);
  return std::stoll(status.substr(3, space - 3));
}

void maybe_crash(const Config& c, std::int64_t step, int rank, int world) {
  if (rank != world - 1 || step == 0) return;
  const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
  if (attempt != nullptr && std::string(attempt) != "0") return;
  if (step == c.crash_at_step) {
    ddp::log::warn("--crash_at_step {}: killing this rank (SIGKILL)", step);
    ::kill(::getpid(), SIGKILL);
  }
  if (step == c.stall_at_step) {
    ddp::log::warn("--stall_at_step {}: stopping this rank (SIGSTOP)", step);
    ::kill(::getpid(), SIGSTOP);
  }
}

int run(const Config& c) {
  const int world = ddp::world_size(), rank = ddp::rank();
  const std::string backend = choose_backend(c);
  // Flag checks that need the world size come before any collective, so a
  // bad combination fails every rank at once with exit code 2.
  std::optional<DataPlan> plan;
  try {
    plan.emplace(c.dataset_size, world, rank, c.batch_size, c.accumulate, c.seed);
  } catch (const ddp::Error& e) {
    throw FlagError(e.what());
  }
  if (!c.checkpoint.empty() && rank == 0) {
    // Found now rather than at the first checkpoint, after minutes of training.
    auto dir = std::filesystem::path(c.checkpoint).parent_path();
    if (dir.empty()) dir = ".";
    if (!std::filesystem::is_directory(dir) || ::access(dir.c_str(), W_OK) != 0) {
      throw FlagError("--checkpoint " + c.checkpoint + ": directory " + dir.string() +
                      " does not exist or is not writable");
    }
  }
  const std::int64_t total_steps =
      c.steps > 0 ? c.steps : std::max<std::int64_t>(c.epochs, 1) * plan->steps_per_epoch();
  if (c.exchange == "activations" && world > 1 &&
      (backend != "shm" || ddp::num_nodes() != 1 || ddp::local_world_size() != world)) {
    throw FlagError(
        "--exchange activations: needs every rank on one node with the shm backend "
        "(this job: backend " +
        backend + ", " + std::to_string(ddp::num_nodes()) + " node(s), " +
        std::to_string(ddp::local_world_size()) + " of " + std::to_string(world) +
        " ranks on this one)");
  }
  const std::int64_t micro_batch = c.batch_size;
  const std::int64_t step_samples = micro_batch * c.accumulate * world;

  ddp::InitOptions init;
  init.backend = backend;
  auto pg = ddp::init(init);

  SyntheticDataset data(c.task, c.dataset_size, c.input_dim, c.output_dim, c.seed);
  std::vector<int> dims{c.input_dim};
  for (int l = 0; l < c.layers; ++l) dims.push_back(c.hidden);
  dims.push_back(c.output_dim);
  const std::unique_ptr<Engine> engine =
      backend == "nccl" ? make_gpu_engine(c, dims, ddp::local_rank()) : make_cpu_engine(c, dims);

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
  ddp::GradSync sync(pg, engine->grad_params(), sync_options);

  ddp::log::info(
      "train: {} rank(s) ({}), MLP {} ({} parameters), {} on {} samples, global batch {} "
      "({} per rank x {} rank(s) x {} micro-batch(es)), {} steps/epoch, {} steps, {} lr {}{} | "
      "math on {}",
      world, pg->backend_name(), dims_text(dims), engine->num_elements(), task_name(c.task),
      c.dataset_size, step_samples, c.batch_size, world, c.accumulate, plan->steps_per_epoch(),
      total_steps, optimizer_name(c.optimizer), c.lr,
      c.shard_optimizer             ? " (sharded: ZeRO)"
      : c.exchange == "activations" ? " (activation exchange: weight-gradient rows in claimed units)"
                                    : "",
      engine->description());

  std::string resumed_from;
  const std::int64_t first_step = resume(c, *engine, *pg, step_samples, &resumed_from);
  // Rank 0's weights and optimizer state everywhere (a fresh start, or what rank 0 just loaded).
  engine->prepare(sync);
  if (!resumed_from.empty()) {
    ddp::log::info("resumed from {} at step {} (epoch {})", resumed_from, first_step,
                   plan->epoch_of(first_step));
  }

  GradSyncSink sink(sync);
  const bool exchange = engine->exchanges_activations();
  Batch batch;
  Progress progress(c.progress, first_step, total_steps, step_samples);
  const std::int64_t steps_to_run = std::max<std::int64_t>(total_steps - first_step, 0);
  const std::int64_t warmup = std::min<std::int64_t>(10, steps_to_run / 10);
  double last_loss = 0;
  std::optional<double> last_accuracy;
  std::string last_checkpoint;
  std::int64_t checkpoint_step = -1;
  Clock::time_point steady_start{};
  const auto t0 = Clock::now();
  progress.start();
  if (warmup == 0) steady_start = t0;

  for (std::int64_t step = first_step; step < total_steps; ++step) {
    double loss_sum = 0;
    std::int64_t correct = 0;
    for (int micro = 0; micro < c.accumulate; ++micro) {
      data.gather(plan->micro_batch(step, micro), batch);
      engine->forward(batch);
      // The mean over the step's micro-batches and ranks: 1/accumulate here,
      // 1/world_size through grad_scale(), 1/batch in the loss gradient.
      const float scale = sync.grad_scale() / static_cast<float>(c.accumulate);
      if (exchange) {
        engine->backward(sink, scale, micro > 0);  // the exchange sums over the ranks itself
      } else {
        // Micro-batches before the last only accumulate into the views (no communication).
        std::optional<ddp::GradSync::NoSync> no_sync;
        if (micro + 1 < c.accumulate) no_sync.emplace(sync);
        sync.begin_backward();
        engine->backward(sink, scale, micro > 0);
        sync.finish();
      }
      // Asked after backward: on a GPU this is where the host waits for it.
      const LossResult loss = engine->loss();
      loss_sum += loss.loss;
      correct += loss.correct;
    }
    engine->step(sync);

    const std::int64_t done = step + 1;
    if (done - first_step == warmup) steady_start = Clock::now();
    // Reports at the run's first step, every log_every steps and at the end:
    // a function of the step alone, so every rank joins the same averages.
    if (done == first_step + 1 || done % c.log_every == 0 || done == total_steps) {
      ddp::Metrics local{{"loss", loss_sum / c.accumulate}};
      if (c.task == Task::kClassification) {
        local["accuracy"] =
            static_cast<double>(correct) / static_cast<double>(micro_batch * c.accumulate);
      }
      auto avg = ddp::average_metrics(local, static_cast<double>(micro_batch * c.accumulate), *pg);
      last_loss = avg["loss"];
      if (avg.count("accuracy")) last_accuracy = avg["accuracy"];
      progress.report(done, plan->epoch_of(step), last_loss, last_accuracy);
    } else {
      progress.tick(done, plan->epoch_of(step));
    }
    if (!c.checkpoint.empty() &&
        ((c.checkpoint_every > 0 && done % c.checkpoint_every == 0) || done == total_steps)) {
      pg->barrier();  // every rank finished the step: the checkpoint is of a step the whole job
                      // took
      engine->gather_state();
      if (rank == 0) {
        save_checkpoint(c.checkpoint,
                        describe_run(c, dims, done, plan->epoch_of(step), step_samples, world),
                        engine->host_state());
      }
      last_checkpoint = c.checkpoint;
      checkpoint_step = done;
    }
    maybe_crash(c, done, rank, world);
  }
  const auto t_end = Clock::now();
  progress.end();

  // The summary: figures from every rank (collectives, so every rank takes part).
  const auto stats = sync.stats();
  double timing[5] = {stats.mean.backward_compute_ms, stats.mean.comm_ms, stats.mean.overlap_ms,
                      stats.mean.exposed_comm_ms, stats.mean.inline_comm_ms};
  pg->all_reduce(timing, 5, ddp::DType::kFloat64, ddp::ReduceOp::kAvg);
  const ddp::MemoryStats mem = ddp::memory_stats();
  double peak = static_cast<double>(mem.peak_rss);
  pg->all_reduce(&peak, 1, ddp::DType::kFloat64, ddp::ReduceOp::kMax);

  if (steps_to_run == 0) {
    ddp::log::info("summary: nothing to do: already at step {} of {}", first_step, total_steps);
  } else {
    const double seconds = std::chrono::duration<double>(t_end - t0).count();
    const double steady_seconds = std::chrono::duration<double>(t_end - steady_start).count();
    const double throughput = static_cast<double>(steps_to_run * step_samples) / seconds;
    const double steady =
        static_cast<double>((steps_to_run - warmup) * step_samples) / steady_seconds;
    std::string line = fmt::format(
        "summary: {} steps in {:.2f} s | {:.0f} samples/s | steady {:.0f} samples/s "
        "(after {} warm-up steps) | final loss {:.8f}",
        steps_to_run, seconds, throughput, steady, warmup, last_loss);
    if (last_accuracy) line += fmt::format(" | acc {:.4f}", *last_accuracy);
    ddp::log::info("{}", line);
  }
  const double mib = 1024.0 * 1024.0;
  if (stats.synced_iterations > 0) {
    const double overlap_pct = timing[1] > 0 ? 100.0 * timing[2] / timing[1] : 0;
    ddp::log::info(
        "summary: gradient sync, mean per synced iteration over {} and {} rank(s): backward "
        "{:.2f} ms | communication {:.2f} ms | overlapped {:.2f} ms ({:.0f}%) | exposed {:.2f} ms "
        "| {} | {} buckets, {:.2f} MB per step",
        stats.synced_iterations, world, timing[0], timing[1], timing[2], overlap_pct, timing[3],
        sync.comm_mode() == ddp::CommMode::kInline
            ? fmt::format("inline on the compute thread {:.2f} ms", timing[4])
        : sync.comm_mode() == ddp::CommMode::kShared
            ? std::string("shared sum: no collectives, communication = waiting for other ranks")
            : std::string("on the group's thread"),
        stats.last.buckets, static_cast<double>(stats.last.bytes_on_wire) / 1e6);
  }
  if (const auto ex = engine->exchange_stats(); ex && ex->backwards > 0) {
    double figures[2] = {ex->backward_ms, ex->waited_ms};
    pg->all_reduce(figures, 2, ddp::DType::kFloat64, ddp::ReduceOp::kAvg);
    // Each rank's share of the units: how the claiming balanced the ranks.
    std::vector<double> taken(static_cast<std::size_t>(world));
    pg->all_gather(&ex->units_taken, taken.data(), 1, ddp::DType::kFloat64);
    std::string shares;
    for (int r = 0; r < world; ++r) {
      shares += fmt::format("{}{:.1f}", r == 0 ? "" : "/", taken[static_cast<std::size_t>(r)]);
    }
    ddp::log::info(
        "summary: activation exchange, mean per backward pass over {} and {} rank(s): backward "
        "and update {:.2f} ms | waiting for the other ranks {:.2f} ms | units of {} taken by "
        "rank 0/1/...: {} | {:.2f} MB of rows written per pass (all ranks)",
        ex->backwards, world, figures[0], figures[1], ex->units, shares,
        static_cast<double>(ex->bytes_per_backward) / 1e6);
  }
  ddp::log::info(
      "summary: memory: peak RSS {:.1f} MiB on rank 0, {:.1f} MiB max over ranks | USS {:.1f} MiB "
      "on rank 0",
      static_cast<double>(mem.peak_rss) / mib, peak / mib, static_cast<double>(mem.uss) / mib);
  if (checkpoint_step >= 0) {
    ddp::log::info("summary: checkpoint {} at step {}", last_checkpoint, checkpoint_step);
  }
  ddp::shutdown();
  return 0;
}

}  // namespace
}  // namespace train

int main(int argc, char** argv) {
  auto parsed = train::parse_flags(std::vector<std::string>(argv, argv + argc));
  if (!parsed.config) {
    std::fputs(parsed.text.c_str(), parsed.exit_code == 0 ? stdout : stderr);
    if (!parsed.text.empty() && parsed.text.back() != '\n')
      std::fputc('\n', parsed.exit_code == 0 ? stdout : stderr);
    return parsed.exit_code;
  }
  try {
    return train::run(*parsed.config);
  } catch (const train::FlagError& e) {
    std::fprintf(stderr, "train: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    ddp::log::error("train: {}", e.what());
    return 1;
  }
}
