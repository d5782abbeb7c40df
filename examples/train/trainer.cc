// The training loop. Every rank builds the same dataset (data.h) and MLP from
// --seed, reads its part of each global batch (DataPlan), runs forward and
// backward — on the CPU with OpenBLAS (one thread), or with --backend nccl on
// CUDA device LOCAL_RANK with cuBLAS (engine.h) — and writes each layer's
// gradients straight into ddp::GradSync's bucket views, last layer first,
// marking each ready at once: a bucket's all-reduce runs on the group's
// thread while the layers below are still being differentiated. finish()
// leaves the averaged gradients in the views and every rank applies the same
// optimizer step. Rank 0 alone prints and writes checkpoints.

#include "trainer.h"

#include <fmt/ranges.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "checkpoint.h"
#include "data.h"
#include "ddp/ddp.h"
#include "ddp/heal.h"
#include "ddp/log.h"
#include "ddp/metrics.h"
#include "engine.h"
#include "flags.h"
#include "float_mode.h"
#include "heal_loop.h"

namespace train {
namespace {

using Clock = std::chrono::steady_clock;

// A problem with the flags found after parsing (needs the world size or the
// data): exit 2, before any collective.
struct FlagError : ddp::Error {
  using ddp::Error::Error;
};

// --backend, else $DDP_BACKEND, else auto; checked here for both sources.
std::string choose_backend(const Config& c) {
  std::string backend = c.backend;
  std::string named = "--backend " + backend;
  if (backend.empty()) {
    const char* env = std::getenv("DDP_BACKEND");
    backend = env != nullptr && *env != '\0' ? env : "auto";
    named = "DDP_BACKEND=" + backend;
  }
  if (auto problem = backend_problem(c, backend, named); !problem.empty()) throw FlagError(problem);
  // auto means the CPU: shared memory among the ranks of a node (Gloo across
  // nodes). The GPU is asked for by name.
  if (backend == "auto") backend = ddp::cpu_backend();
  if (backend == "nccl") {
    if (auto problem = gpu_problem(ddp::local_rank()); !problem.empty())
      throw FlagError(named + ": " + problem);
  }
  return backend;
}

// Rank 0 reads the checkpoint into the model and optimizer state; every rank
// learns the outcome (a failure is raised on every rank, not only on rank 0).
// Returns the step to continue from (0: a fresh start).
std::int64_t resume(const Config& c, Engine& engine, ddp::ProcessGroup& pg,
                    const CheckpointMeta& mine, std::string* from) {
  if (c.resume.empty()) return 0;
  const std::string path = c.resume == "auto" ? c.checkpoint : c.resume;
  std::string status;
  if (pg.rank() == 0) {
    try {
      if (c.resume == "auto" && !std::filesystem::exists(path)) {
        status = "fresh";
      } else {
        CheckpointMeta meta = load_checkpoint(path, engine.host_state());
        // What must match (the buffers' shapes alone may not tell), then what only changes the data
        // order.
        for (const char* key : {"model", "task", "optimizer"}) {
          if (meta[key] != mine.at(key)) {
            throw ddp::Error("checkpoint " + path + " was written for " + key + " " + meta[key] +
                             ", this run has " + mine.at(key));
          }
        }
        for (const char* key : {"data", "seed", "dataset_size", "global_batch"}) {
          if (meta[key] != mine.at(key)) {
            ddp::log::warn(
                "checkpoint {} was written with {} {}, this run has {}: the data order "
                "differs from the original run's",
                path, key, meta[key], mine.at(key));
          }
        }
        engine.load_host_state();
        status = "ok " + meta["step"];
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
  *from = path;
  return std::stoll(status.substr(3));
}

// Loss and accuracy on the held-out set: each rank evaluates every W-th
// sample (ddp::strided_shard: no sample twice); the ranks' figures are
// averaged weighted by their samples (ddp::average_metrics).
void evaluate(Engine& engine, const Dataset& test, ddp::ProcessGroup& pg) {
  const std::vector<std::int64_t> mine = ddp::strided_shard(test.size(), pg.size(), pg.rank());
  ddp::Metrics local{{"loss", 0}, {"accuracy", 0}};
  if (!mine.empty()) {
    Batch batch;
    test.gather(mine, batch);
    engine.forward(batch, nullptr);
    const LossResult r = engine.loss();
    local = {{"loss", r.loss}, {"accuracy", static_cast<double>(r.correct) / batch.size}};
  }
  const auto avg = ddp::average_metrics(local, static_cast<double>(mine.size()), pg);
  ddp::log::info("summary: test set: {} held-out samples | loss {:.8f} | accuracy {:.4f}",
                 test.size(), avg.at("loss"), avg.at("accuracy"));
}

// What the run knows before any collective: the flag checks that need the
// world size or the data come first, so a bad combination fails every rank at
// once with exit code 2.
struct Prepared {
  std::string backend;
  Data data;
  std::optional<DataPlan> plan;
  std::vector<int> dims;  // the MLP's layer widths
};

Prepared prepare(const Config& c) {
  Prepared p;
  p.backend = choose_backend(c);
  try {
    p.data = load_data(c);
    p.plan.emplace(p.data.train.size(), ddp::world_size(), ddp::rank(), c.batch_size, c.accumulate,
                   c.seed);
  } catch (const ddp::Error& e) {
    throw FlagError((c.data == "digits" ? "--data digits: " : "--dataset_size ") +
                    std::string(e.what()));
  }
  if (!c.checkpoint.empty() && ddp::rank() == 0) {
    // Found now rather than at the first checkpoint, after minutes of training.
    auto dir = std::filesystem::path(c.checkpoint).parent_path();
    if (dir.empty()) dir = ".";
    if (!std::filesystem::is_directory(dir) || ::access(dir.c_str(), W_OK) != 0) {
      throw FlagError("--checkpoint " + c.checkpoint + ": directory " + dir.string() +
                      " does not exist or is not writable");
    }
  }
  p.dims = {c.input_dim};
  for (int l = 0; l < c.layers; ++l) p.dims.push_back(c.hidden);
  p.dims.push_back(c.output_dim);
  return p;
}

// The loop under --on_failure=restart (the default): a failure restarts
// every rank, which resume from the last checkpoint.
class RestartTrainer {
 public:
  RestartTrainer(const Config& c, Prepared& p);
  int run(const AfterStep& after_step);

 private:
  CheckpointMeta describe(std::int64_t step, std::int64_t epoch) const;
  void log_start() const;
  void train_step(std::int64_t step, double* loss_sum, std::int64_t* correct);
  void report(std::int64_t step, double loss_sum, std::int64_t correct);
  void checkpoint(std::int64_t step);
  void summarize(Clock::time_point t_end);

  const Config& c_;
  Data& data_;
  DataPlan& plan_;
  const int world_ = ddp::world_size(), rank_ = ddp::rank();
  const std::string model_;  // "32-128-128-10"
  std::shared_ptr<ddp::ProcessGroup> pg_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<ddp::GradAverager> sync_;  // comm_mode shared: a SharedGradSum, else GradSync
  std::int64_t total_steps_, rank_samples_, step_samples_;
  std::int64_t first_step_ = 0, warmup_ = 0, checkpoint_step_ = -1, last_report_step_ = 0;
  std::string last_losses_;  // the latest report's "loss X | acc Y" (acc: classification)
  Clock::time_point t0_, steady_start_, last_report_;
  Batch batch_;
};

RestartTrainer::RestartTrainer(const Config& c, Prepared& p)
    : c_(c),
      data_(p.data),
      plan_(*p.plan),
      model_(fmt::format("{}", fmt::join(p.dims, "-"))),
      total_steps_(c.steps > 0 ? c.steps
                               : std::max<std::int64_t>(c.epochs, 1) * p.plan->steps_per_epoch()),
      rank_samples_(std::int64_t{c.batch_size} * c.accumulate),
      step_samples_(rank_samples_ * world_) {
  ddp::InitOptions init;
  init.backend = p.backend;
  pg_ = ddp::init(init);
  engine_ = p.backend == "nccl" ? make_gpu_engine(c, p.dims, ddp::local_rank())
                                : make_cpu_engine(c, p.dims);
  sync_ = ddp::make_grad_averager(pg_, engine_->grad_params(), grad_sync_options(c));
}

// What a checkpoint says about the run that wrote it.
CheckpointMeta RestartTrainer::describe(std::int64_t step, std::int64_t epoch) const {
  return {{"step", std::to_string(step)},
          {"epoch", std::to_string(epoch)},
          {"model", model_},
          {"task", task_name(c_.task)},
          {"optimizer", optimizer_name(c_.optimizer)},
          {"data", c_.data},
          {"seed", std::to_string(c_.seed)},
          {"dataset_size", std::to_string(data_.train.size())},
          {"global_batch", std::to_string(step_samples_)},
          {"world_size", std::to_string(world_)},
          // Nothing random happens during training: the data order is a
          // function of (seed, epoch) and the position in it of the step.
          {"rng", "none"}};
}

void RestartTrainer::log_start() const {
  std::size_t num_elements = 0;
  for (const auto& p : engine_->grad_params()) num_elements += p.count();
  ddp::log::info(
      "train: {} rank(s) ({}), MLP {} ({} parameters), {} on {} {} samples{}, global batch {} "
      "({} per rank x {} rank(s) x {} micro-batch(es)), {} steps/epoch, {} steps, {} lr {}{} | "
      "math on {}",
      world_, pg_->backend_name(), model_, num_elements, task_name(c_.task), data_.train.size(),
      c_.data, data_.test.size() > 0 ? fmt::format(" ({} held out)", data_.test.size()) : "",
      step_samples_, c_.batch_size, world_, c_.accumulate, plan_.steps_per_epoch(), total_steps_,
      optimizer_name(c_.optimizer), c_.lr, c_.shard_optimizer ? " (sharded: ZeRO)" : "",
      engine_->description());
}

void RestartTrainer::train_step(std::int64_t step, double* loss_sum, std::int64_t* correct) {
  ddp::GradAverager& sync = *sync_;
  for (int micro = 0; micro < c_.accumulate; ++micro) {
    data_.train.gather(plan_.micro_batch(step, micro), batch_);
    engine_->forward(batch_, nullptr);
    // The mean over the step's micro-batches and ranks: 1/accumulate here,
    // 1/world_size through grad_scale(), 1/batch in the loss gradient.
    const float scale = sync.grad_scale() / static_cast<float>(c_.accumulate);
    // Micro-batches before the last only accumulate into the views (no communication).
    std::optional<ddp::GradAverager::NoSync> no_sync;
    if (micro + 1 < c_.accumulate) no_sync.emplace(sync);
    sync.begin_backward();
    engine_->backward(sync, scale, micro > 0);
    sync.finish();
    // Asked after backward: on a GPU this is where the host waits for it.
    const LossResult loss = engine_->loss();
    *loss_sum += loss.loss;
    *correct += loss.correct;
  }
  engine_->step(sync);
}

// Reports at the run's first step, every log_every steps and at the end: a
// function of the step alone, so every rank joins the same averages.
void RestartTrainer::report(std::int64_t step, double loss_sum, std::int64_t correct) {
  const std::int64_t done = step + 1;
  if (!(done == first_step_ + 1 || done % c_.log_every == 0 || done == total_steps_)) return;
  ddp::Metrics local{{"loss", loss_sum / c_.accumulate}};
  if (c_.task == Task::kClassification)
    local["accuracy"] = static_cast<double>(correct) / static_cast<double>(rank_samples_);
  const auto avg = ddp::average_metrics(local, static_cast<double>(rank_samples_), *pg_);
  last_losses_ = fmt::format("loss {:.8f}", avg.at("loss"));
  if (avg.count("accuracy")) last_losses_ += fmt::format(" | acc {:.4f}", avg.at("accuracy"));
  // Samples/s since the last report; the time left at the run's mean pace so far.
  const auto now = Clock::now();
  const double interval = std::chrono::duration<double>(now - last_report_).count();
  const auto eta = std::llround(std::chrono::duration<double>(now - t0_).count() *
                                static_cast<double>(total_steps_ - done) /
                                static_cast<double>(done - first_step_));
  ddp::log::info("step {}/{} | epoch {} | {} | {:.0f} samples/s | ETA {}:{:02}:{:02}", done,
                 total_steps_, plan_.epoch_of(step) + 1, last_losses_,
                 static_cast<double>((done - last_report_step_) * step_samples_) / interval,
                 eta / 3600, eta / 60 % 60, eta % 60);
  last_report_ = now;
  last_report_step_ = done;
}

void RestartTrainer::checkpoint(std::int64_t step) {
  const std::int64_t done = step + 1;
  if (c_.checkpoint.empty() ||
      !((c_.checkpoint_every > 0 && done % c_.checkpoint_every == 0) || done == total_steps_)) {
    return;
  }
  pg_->barrier();  // every rank finished the step: the checkpoint is of a step the whole job took
  engine_->gather_state();
  if (rank_ == 0) {
    save_checkpoint(c_.checkpoint, describe(done, plan_.epoch_of(step)), engine_->host_state());
  }
  checkpoint_step_ = done;
}

int RestartTrainer::run(const AfterStep& after_step) {
  log_start();
  std::string resumed_from;
  first_step_ = resume(c_, *engine_, *pg_, describe(0, 0), &resumed_from);
  // Rank 0's weights and optimizer state everywhere (a fresh start, or what rank 0 just loaded).
  engine_->prepare(*sync_);
  if (!resumed_from.empty()) {
    ddp::log::info("resumed from {} at step {} (epoch {})", resumed_from, first_step_,
                   plan_.epoch_of(first_step_));
  }
  const std::int64_t steps_to_run = std::max<std::int64_t>(total_steps_ - first_step_, 0);
  warmup_ = std::min<std::int64_t>(10, steps_to_run / 10);
  t0_ = steady_start_ = last_report_ = Clock::now();
  last_report_step_ = first_step_;
  for (std::int64_t step = first_step_; step < total_steps_; ++step) {
    double loss_sum = 0;
    std::int64_t correct = 0;
    train_step(step, &loss_sum, &correct);
    if (step + 1 - first_step_ == warmup_) steady_start_ = Clock::now();
    report(step, loss_sum, correct);
    checkpoint(step);
    if (after_step) after_step(step + 1);
  }
  summarize(Clock::now());
  if (data_.test.size() > 0) evaluate(*engine_, data_.test, *pg_);
  ddp::shutdown();
  return 0;
}

// The summary: figures from every rank (collectives, so every rank takes part).
void RestartTrainer::summarize(Clock::time_point t_end) {
  const ddp::GradAverager& sync = *sync_;
  const auto stats = sync.stats();
  double timing[5] = {stats.mean.backward_compute_ms, stats.mean.comm_ms, stats.mean.overlap_ms,
                      stats.mean.exposed_comm_ms, stats.mean.inline_comm_ms};
  pg_->all_reduce(timing, 5, ddp::DType::kFloat64, ddp::ReduceOp::kAvg);
  const ddp::MemoryStats mem = ddp::memory_stats();
  double peak = static_cast<double>(mem.peak_rss);
  pg_->all_reduce(&peak, 1, ddp::DType::kFloat64, ddp::ReduceOp::kMax);

  const std::int64_t steps_to_run = std::max<std::int64_t>(total_steps_ - first_step_, 0);
  if (steps_to_run == 0) {
    ddp::log::info("summary: nothing to do: already at step {} of {}", first_step_, total_steps_);
  } else {
    const double seconds = std::chrono::duration<double>(t_end - t0_).count();
    const double steady_seconds = std::chrono::duration<double>(t_end - steady_start_).count();
    ddp::log::info(
        "summary: {} steps in {:.2f} s | {:.0f} samples/s | steady {:.0f} samples/s "
        "(after {} warm-up steps) | final {}",
        steps_to_run, seconds, static_cast<double>(steps_to_run * step_samples_) / seconds,
        static_cast<double>((steps_to_run - warmup_) * step_samples_) / steady_seconds, warmup_,
        last_losses_);
  }
  if (stats.synced_iterations > 0) {
    const double overlap_pct = timing[1] > 0 ? 100.0 * timing[2] / timing[1] : 0;
    ddp::log::info(
        "summary: gradient sync, mean per synced iteration over {} and {} rank(s): backward "
        "{:.2f} ms | communication {:.2f} ms | overlapped {:.2f} ms ({:.0f}%) | exposed {:.2f} ms "
        "| {} | {} buckets, {:.2f} MB per step",
        stats.synced_iterations, world_, timing[0], timing[1], timing[2], overlap_pct, timing[3],
        sync.comm_mode() == ddp::CommMode::kInline
            ? fmt::format("inline on the compute thread {:.2f} ms", timing[4])
        : sync.comm_mode() == ddp::CommMode::kShared
            ? std::string("shared sum: no collectives, communication = waiting for other ranks")
            : std::string("on the group's thread"),
        stats.last.buckets, static_cast<double>(stats.last.bytes_on_wire) / 1e6);
  }
  const double mib = 1024.0 * 1024.0;
  ddp::log::info(
      "summary: memory: peak RSS {:.1f} MiB on rank 0, {:.1f} MiB max over ranks | USS {:.1f} MiB "
      "on rank 0",
      static_cast<double>(mem.peak_rss) / mib, peak / mib, static_cast<double>(mem.uss) / mib);
  if (checkpoint_step_ >= 0)
    ddp::log::info("summary: checkpoint {} at step {}", c_.checkpoint, checkpoint_step_);
}

int run(const Config& c, const Hooks& hooks) {
  Prepared p = prepare(c);
  if (ddp::Healer::requested()) return run_healing(c, p.data, p.dims, p.backend, hooks);
  RestartTrainer trainer(c, p);
  return trainer.run(hooks.after_step);
}

}  // namespace

int run_trainer(const std::vector<std::string>& argv, const Hooks& hooks) {
  const ParseResult parsed = parse_flags(argv);
  if (!parsed.config) {
    FILE* out = parsed.exit_code == 0 ? stdout : stderr;
    std::fputs(parsed.text.c_str(), out);
    if (!parsed.text.empty() && parsed.text.back() != '\n') std::fputc('\n', out);
    return parsed.exit_code;
  }
  // Before any thread starts: libddp's threads inherit the mode.
  if (!parsed.config->keep_denormals) flush_denormals();
  try {
    return run(*parsed.config, hooks);
  } catch (const FlagError& e) {
    std::fprintf(stderr, "train: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    ddp::log::error("train: {}", e.what());
    return 1;
  }
}

}  // namespace train
