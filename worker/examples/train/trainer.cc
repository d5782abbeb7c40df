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
    engine.forward(batch);
    const LossResult r = engine.loss();
    local = {{"loss", r.loss}, {"accuracy", static_cast<double>(r.correct) / batch.size}};
  }
  const auto avg = ddp::average_metrics(local, static_cast<double>(mine.size()), pg);
  ddp::log::info("summary: test set: {} held-out samples | loss {:.8f} | accuracy {:.4f}",
                 test.size(), avg.at("loss"), avg.at("accuracy"));
}

int run(const Config& c, const AfterStep& after_step, const std::function<void()>& after_reform) {
  const int world = ddp::world_size(), rank = ddp::rank();
  const std::string backend = choose_backend(c);
  // Flag checks that need the world size or the data come before any
  // collective, so a bad combination fails every rank at once with exit code 2.
  Data data;
  std::optional<DataPlan> plan;
  try {
    data = load_data(c);
    plan.emplace(data.train.size(), world, rank, c.batch_size, c.accumulate, c.seed);
  } catch (const ddp::Error& e) {
    throw FlagError((c.data == "digits" ? "--data digits: " : "--dataset_size ") +
                    std::string(e.what()));
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
  std::vector<int> dims{c.input_dim};
  for (int l = 0; l < c.layers; ++l) dims.push_back(c.hidden);
  dims.push_back(c.output_dim);
  if (ddp::Healer::requested()) {
    const std::string why = heal_unsupported(c, backend);
    if (why.empty()) return run_healing(c, data, dims, backend, {after_step, after_reform});
    ddp::log::info("--on_failure=heal: {}: a failure restarts every rank instead", why);
  }
  const std::int64_t total_steps =
      c.steps > 0 ? c.steps : std::max<std::int64_t>(c.epochs, 1) * plan->steps_per_epoch();
  const std::int64_t rank_samples = std::int64_t{c.batch_size} * c.accumulate;  // per step
  const std::int64_t step_samples = rank_samples * world;

  ddp::InitOptions init;
  init.backend = backend;
  auto pg = ddp::init(init);

  const std::string model = fmt::format("{}", fmt::join(dims, "-"));  // "32-128-128-10"
  const std::unique_ptr<Engine> engine =
      backend == "nccl" ? make_gpu_engine(c, dims, ddp::local_rank()) : make_cpu_engine(c, dims);

  const ddp::GradSyncOptions sync_options = grad_sync_options(c);
  const std::vector<ddp::GradParam> params = engine->grad_params();
  // comm_mode shared: a ddp::SharedGradSum; otherwise a ddp::GradSync.
  const std::unique_ptr<ddp::GradAverager> averager =
      ddp::make_grad_averager(pg, params, sync_options);
  ddp::GradAverager& sync = *averager;
  std::size_t num_elements = 0;
  for (const auto& p : params) num_elements += p.count();

  ddp::log::info(
      "train: {} rank(s) ({}), MLP {} ({} parameters), {} on {} {} samples{}, global batch {} "
      "({} per rank x {} rank(s) x {} micro-batch(es)), {} steps/epoch, {} steps, {} lr {}{} | "
      "math on {}",
      world, pg->backend_name(), model, num_elements, task_name(c.task), data.train.size(), c.data,
      data.test.size() > 0 ? fmt::format(" ({} held out)", data.test.size()) : "", step_samples,
      c.batch_size, world, c.accumulate, plan->steps_per_epoch(), total_steps,
      optimizer_name(c.optimizer), c.lr, c.shard_optimizer ? " (sharded: ZeRO)" : "",
      engine->description());

  // What a checkpoint says about the run that wrote it.
  const auto describe = [&](std::int64_t step, std::int64_t epoch) -> CheckpointMeta {
    return {{"step", std::to_string(step)},
            {"epoch", std::to_string(epoch)},
            {"model", model},
            {"task", task_name(c.task)},
            {"optimizer", optimizer_name(c.optimizer)},
            {"data", c.data},
            {"seed", std::to_string(c.seed)},
            {"dataset_size", std::to_string(data.train.size())},
            {"global_batch", std::to_string(step_samples)},
            {"world_size", std::to_string(world)},
            // Nothing random happens during training: the data order is a
            // function of (seed, epoch) and the position in it of the step.
            {"rng", "none"}};
  };
  std::string resumed_from;
  const std::int64_t first_step = resume(c, *engine, *pg, describe(0, 0), &resumed_from);
  // Rank 0's weights and optimizer state everywhere (a fresh start, or what rank 0 just loaded).
  engine->prepare(sync);
  if (!resumed_from.empty()) {
    ddp::log::info("resumed from {} at step {} (epoch {})", resumed_from, first_step,
                   plan->epoch_of(first_step));
  }

  Batch batch;
  const std::int64_t steps_to_run = std::max<std::int64_t>(total_steps - first_step, 0);
  const std::int64_t warmup = std::min<std::int64_t>(10, steps_to_run / 10);
  std::string last_losses;  // the latest report's "loss X | acc Y" (acc: classification)
  std::int64_t checkpoint_step = -1;
  const auto t0 = Clock::now();
  Clock::time_point steady_start = t0, last_report = t0;
  std::int64_t last_report_step = first_step;

  for (std::int64_t step = first_step; step < total_steps; ++step) {
    double loss_sum = 0;
    std::int64_t correct = 0;
    for (int micro = 0; micro < c.accumulate; ++micro) {
      data.train.gather(plan->micro_batch(step, micro), batch);
      engine->forward(batch);
      // The mean over the step's micro-batches and ranks: 1/accumulate here,
      // 1/world_size through grad_scale(), 1/batch in the loss gradient.
      const float scale = sync.grad_scale() / static_cast<float>(c.accumulate);
      // Micro-batches before the last only accumulate into the views (no communication).
      std::optional<ddp::GradAverager::NoSync> no_sync;
      if (micro + 1 < c.accumulate) no_sync.emplace(sync);
      sync.begin_backward();
      engine->backward(sync, scale, micro > 0);
      sync.finish();
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
      if (c.task == Task::kClassification)
        local["accuracy"] = static_cast<double>(correct) / static_cast<double>(rank_samples);
      const auto avg = ddp::average_metrics(local, static_cast<double>(rank_samples), *pg);
      last_losses = fmt::format("loss {:.8f}", avg.at("loss"));
      if (avg.count("accuracy")) last_losses += fmt::format(" | acc {:.4f}", avg.at("accuracy"));
      // Samples/s since the last report; the time left at the run's mean pace so far.
      const auto now = Clock::now();
      const double interval = std::chrono::duration<double>(now - last_report).count();
      const auto eta = std::llround(std::chrono::duration<double>(now - t0).count() *
                                    static_cast<double>(total_steps - done) /
                                    static_cast<double>(done - first_step));
      ddp::log::info("step {}/{} | epoch {} | {} | {:.0f} samples/s | ETA {}:{:02}:{:02}", done,
                     total_steps, plan->epoch_of(step) + 1, last_losses,
                     static_cast<double>((done - last_report_step) * step_samples) / interval,
                     eta / 3600, eta / 60 % 60, eta % 60);
      last_report = now;
      last_report_step = done;
    }
    if (!c.checkpoint.empty() &&
        ((c.checkpoint_every > 0 && done % c.checkpoint_every == 0) || done == total_steps)) {
      pg->barrier();  // every rank finished the step: the checkpoint is of a step the whole job
                      // took
      engine->gather_state();
      if (rank == 0)
        save_checkpoint(c.checkpoint, describe(done, plan->epoch_of(step)), engine->host_state());
      checkpoint_step = done;
    }
    if (after_step) after_step(done);
  }
  const auto t_end = Clock::now();

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
    ddp::log::info(
        "summary: {} steps in {:.2f} s | {:.0f} samples/s | steady {:.0f} samples/s "
        "(after {} warm-up steps) | final {}",
        steps_to_run, seconds, static_cast<double>(steps_to_run * step_samples) / seconds,
        static_cast<double>((steps_to_run - warmup) * step_samples) / steady_seconds, warmup,
        last_losses);
  }
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
  const double mib = 1024.0 * 1024.0;
  ddp::log::info(
      "summary: memory: peak RSS {:.1f} MiB on rank 0, {:.1f} MiB max over ranks | USS {:.1f} MiB "
      "on rank 0",
      static_cast<double>(mem.peak_rss) / mib, peak / mib, static_cast<double>(mem.uss) / mib);
  if (checkpoint_step >= 0)
    ddp::log::info("summary: checkpoint {} at step {}", c.checkpoint, checkpoint_step);
  if (data.test.size() > 0) evaluate(*engine, data.test, *pg);
  ddp::shutdown();
  return 0;
}

}  // namespace

int run_trainer(const std::vector<std::string>& argv, const AfterStep& after_step,
                const std::function<void()>& after_reform) {
  const ParseResult parsed = parse_flags(argv);
  if (!parsed.config) {
    FILE* out = parsed.exit_code == 0 ? stdout : stderr;
    std::fputs(parsed.text.c_str(), out);
    if (!parsed.text.empty() && parsed.text.back() != '\n') std::fputc('\n', out);
    return parsed.exit_code;
  }
  try {
    return run(*parsed.config, after_step, after_reform);
  } catch (const FlagError& e) {
    std::fprintf(stderr, "train: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    ddp::log::error("train: {}", e.what());
    return 1;
  }
}

}  // namespace train
