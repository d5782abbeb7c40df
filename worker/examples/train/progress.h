#pragma once
// What rank 0 prints while training: one progress report at the first
// step, every --log_every steps and at the last step — step/total, epoch, loss averaged across
// ranks, samples/s over the last interval, ETA — and the summary at the end.
//
// On a terminal (stdout isatty, or --progress bar) a live bar is redrawn in
// place with '\r' after every step (at most 10 times a second), showing the
// loss of the latest report; other ddp::log lines (GradSync's, warnings) are
// printed above it and the bar is redrawn. Otherwise (a pipe, a file,
// under ddprun) each report is one plain line through ddp::log::info:
//   step 20/300 | epoch 1 | loss 0.41023591 | acc 0.8750 | 5120 samples/s | ETA 0:00:12
// Only the logging rank (rank 0) prints; the other ranks' calls do nothing.
// Every number is computed by the caller on every rank: nothing here is a
// collective, so printing can never make ranks disagree.

#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace train {

class BarScreen;  // the bar on the terminal and the log lines printed above it (progress.cc)

struct Report {
  std::int64_t step = 0;           // steps done (1-based)
  std::int64_t total = 0;          // steps in the run
  std::int64_t epoch = 0;          // 0-based epoch of the step (printed 1-based)
  double loss = 0;                 // NaN: none yet (the bar shows "-")
  std::optional<double> accuracy;  // classification
  double samples_per_s = 0;
  double eta_s = 0;
};

// "step 20/300 | epoch 1 | loss 0.41023591 | acc 0.8750 | 5120 samples/s | ETA 0:00:12"
std::string format_line(const Report& report);
// "[=========>          ]  20/300 loss 0.4102 acc 0.875 | 5120 samples/s | ETA 0:00:12"
std::string format_bar(const Report& report, int width);
// Seconds as H:MM:SS.
std::string format_duration(double seconds);

class Progress {
 public:
  // mode: "auto" (bar when stdout is a terminal), "bar" or "lines". The run
  // goes from step first_step to total_steps; each step trains on
  // samples_per_step samples (all ranks together).
  Progress(const std::string& mode, std::int64_t first_step, std::int64_t total_steps,
           std::int64_t samples_per_step);
  ~Progress();  // ends the bar and gives ddp::log its console back
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Call once, right before the first step.
  void start();
  // After every step (only redraws the bar; local, cheap).
  void tick(std::int64_t step, std::int64_t epoch);
  // At a reporting step: `step` steps are done; the loss (and accuracy) are
  // already averaged across ranks. Fills in the throughput and ETA, prints.
  void report(std::int64_t step, std::int64_t epoch, double loss, std::optional<double> accuracy);
  // Ends the bar's line (before the summary).
  void end();
  bool bar() const { return bar_ != nullptr; }

 private:
  using Clock = std::chrono::steady_clock;
  Report make_report(std::int64_t step, std::int64_t epoch, Clock::time_point now);
  std::int64_t first_step_, total_steps_, samples_per_step_;
  bool printing_;
  std::shared_ptr<BarScreen> bar_;
  Clock::time_point start_, last_time_, last_draw_;
  std::int64_t last_step_ = 0;  // the step of the latest report
  double rate_ = 0;             // samples/s over the latest interval
  double loss_ = std::nan("");
  std::optional<double> accuracy_;
};

}  // namespace train
