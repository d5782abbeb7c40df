#include "progress.h"

#include <fmt/format.h>
#include <spdlog/details/log_msg.h>
#include <spdlog/sinks/base_sink.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <mutex>

#include "ddp/log.h"

namespace train {

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "-:--:--";
  const auto s = static_cast<long long>(std::llround(seconds));
  return fmt::format("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60);
}

std::string format_line(const Report& r) {
  std::string line =
      fmt::format("step {}/{} | epoch {} | loss {:.8f}", r.step, r.total, r.epoch + 1, r.loss);
  if (r.accuracy) line += fmt::format(" | acc {:.4f}", *r.accuracy);
  line += fmt::format(" | {:.0f} samples/s | ETA {}", r.samples_per_s, format_duration(r.eta_s));
  return line;
}

std::string format_bar(const Report& r, int width) {
  const double done =
      r.total > 0 ? static_cast<double>(r.step) / static_cast<double>(r.total) : 1.0;
  const int filled = static_cast<int>(done * width);
  std::string bar = "[";
  for (int i = 0; i < width; ++i) bar += i < filled ? '=' : (i == filled ? '>' : ' ');
  bar += "]";
  std::string text = fmt::format("{} {}/{} loss ", bar, r.step, r.total);
  text += std::isnan(r.loss) ? "-" : fmt::format("{:.4f}", r.loss);
  if (r.accuracy) text += fmt::format(" acc {:.3f}", *r.accuracy);
  text += fmt::format(" | {:.0f} samples/s | ETA {}", r.samples_per_s, format_duration(r.eta_s));
  return text;
}

// The bar currently on screen. While it is shown, ddp::log's console sinks
// are BarAwareSinks: each line erases the bar, prints, and draws it again.
class BarScreen {
 public:
  void draw(std::string text) {
    std::lock_guard<std::mutex> lock(mu_);
    text_ = std::move(text);
    std::fputs("\r\033[K", stdout);
    std::fputs(text_.c_str(), stdout);
    std::fflush(stdout);
  }
  void print_above(FILE* file, const char* data, std::size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!text_.empty()) {
      std::fputs("\r\033[K", stdout);
      std::fflush(stdout);
    }
    std::fwrite(data, 1, size, file);
    std::fflush(file);
    if (!text_.empty()) {
      std::fputs(text_.c_str(), stdout);
      std::fflush(stdout);
    }
  }
  // Leaves the bar as it is and moves to the next line.
  void end() {
    std::lock_guard<std::mutex> lock(mu_);
    if (text_.empty()) return;
    std::fputs("\n", stdout);
    std::fflush(stdout);
    text_.clear();
  }

 private:
  std::mutex mu_;
  std::string text_;  // "" when no bar is drawn
};

namespace {

class BarAwareSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  BarAwareSink(std::shared_ptr<BarScreen> screen, FILE* file)
      : screen_(std::move(screen)), file_(file) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    screen_->print_above(file_, buf.data(), buf.size());
  }
  void flush_() override { std::fflush(file_); }

 private:
  std::shared_ptr<BarScreen> screen_;
  FILE* file_;
};

bool want_bar(const std::string& mode) {
  if (mode == "bar") return true;
  if (mode == "lines") return false;
  return ::isatty(STDOUT_FILENO) == 1;
}

}  // namespace

Progress::Progress(const std::string& mode, std::int64_t first_step, std::int64_t total_steps,
                   std::int64_t samples_per_step)
    : first_step_(first_step),
      total_steps_(total_steps),
      samples_per_step_(samples_per_step),
      printing_(ddp::log::is_logging_rank()) {
  if (printing_ && want_bar(mode)) {
    bar_ = std::make_shared<BarScreen>();
    ddp::log::set_sinks(std::make_shared<BarAwareSink>(bar_, stdout),
                        std::make_shared<BarAwareSink>(bar_, stderr));
  }
}

Progress::~Progress() {
  end();
  if (bar_) ddp::log::reset_sinks();
}

void Progress::start() {
  start_ = last_time_ = last_draw_ = Clock::now();
  last_step_ = first_step_;
}

Report Progress::make_report(std::int64_t step, std::int64_t epoch, Clock::time_point now) {
  Report r;
  r.step = step;
  r.total = total_steps_;
  r.epoch = epoch;
  r.loss = loss_;
  r.accuracy = accuracy_;
  const double interval = std::chrono::duration<double>(now - last_time_).count();
  if (step > last_step_ && interval > 0) {
    rate_ = static_cast<double>((step - last_step_) * samples_per_step_) / interval;
  }
  r.samples_per_s = rate_;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const std::int64_t done = step - first_step_;
  r.eta_s =
      done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(total_steps_ - step) : 0;
  return r;
}

void Progress::tick(std::int64_t step, std::int64_t epoch) {
  if (!bar_) return;
  const auto now = Clock::now();
  if (now - last_draw_ < std::chrono::milliseconds(100) && step != total_steps_) return;
  last_draw_ = now;
  bar_->draw(format_bar(make_report(step, epoch, now), 30));
}

void Progress::report(std::int64_t step, std::int64_t epoch, double loss,
                      std::optional<double> accuracy) {
  const auto now = Clock::now();
  loss_ = loss;
  accuracy_ = accuracy;
  const Report r = make_report(step, epoch, now);
  last_time_ = now;
  last_step_ = step;
  if (!printing_) return;
  if (bar_) {
    last_draw_ = now;
    bar_->draw(format_bar(r, 30));
  } else {
    ddp::log::info("{}", format_line(r));
  }
}

void Progress::end() {
  if (bar_) bar_->end();
}

}  // namespace train
