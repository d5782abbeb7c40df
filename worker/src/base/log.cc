#include "ddp/log.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <mutex>

#include "base/log_rules.h"
#include "ddp/common/env_contract.h"

namespace ddp::log {
namespace {

struct Identity {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  bool launcher_shows_rank = false;  // DDP_OUTPUT_PREFIXED
};

// The contract does not change during a process's life; read it once,
// straight from the environment (logging sits below the process group). A
// malformed environment must not make logging throw: it logs as a world of
// one (ddp::init() reports the variable).
const Identity& identity() {
  static const Identity id = [] {
    Identity i;
    try {
      if (auto env = WorkerEnv::from_process_env()) {
        i.rank = env->rank;
        i.local_rank = env->local_rank;
        i.world_size = env->world_size;
        i.launcher_shows_rank = env->output_prefixed;
      }
    } catch (...) {
      i = Identity{};
    }
    return i;
  }();
  return id;
}

Level initial_level() {
  Level level = Level::kInfo;
  if (const char* text = std::getenv("DDP_LOG_LEVEL"); text != nullptr) parse_level(text, &level);
  return level;
}

std::atomic<Policy> g_policy{Policy::kRank0};
std::atomic<Level> g_level{initial_level()};

std::shared_ptr<spdlog::logger> make_logger(const char* name,
                                            std::shared_ptr<spdlog::sinks::sink> sink) {
  // Not registered in spdlog's registry: a program's own spdlog set-up (a
  // default logger, set_pattern on all) leaves ours alone, and ours cannot
  // clash with its names.
  auto logger = std::make_shared<spdlog::logger>(name, std::move(sink));
  logger->set_pattern("%v");
  logger->set_level(spdlog::level::trace);  // our own threshold filters first
  logger->flush_on(spdlog::level::trace);
  return logger;
}

struct Loggers {
  std::shared_ptr<spdlog::logger> out, err;
};

std::mutex g_sinks_mu;
Loggers& loggers_locked() {
  static Loggers loggers{make_logger("ddp.out", std::make_shared<spdlog::sinks::stdout_sink_mt>()),
                         make_logger("ddp.err", std::make_shared<spdlog::sinks::stderr_sink_mt>())};
  return loggers;
}

Loggers current_loggers() {
  std::lock_guard<std::mutex> lock(g_sinks_mu);
  return loggers_locked();
}

spdlog::level::level_enum to_spdlog(Level level) {
  switch (level) {
    case Level::kDebug:
      return spdlog::level::debug;
    case Level::kInfo:
      return spdlog::level::info;
    case Level::kWarn:
      return spdlog::level::warn;
    case Level::kError:
      return spdlog::level::err;
    case Level::kOff:
      return spdlog::level::off;
  }
  return spdlog::level::info;
}

}  // namespace

void set_policy(Policy policy) { g_policy.store(policy); }
Policy policy() { return g_policy.load(); }
void set_level(Level level) { g_level.store(level); }
Level level() { return g_level.load(); }

bool is_logging_rank() {
  const Identity& id = identity();
  return should_print(Level::kInfo, false, Level::kInfo, policy(), id.rank, id.local_rank);
}

bool enabled(Level level, bool all) {
  const Identity& id = identity();
  return should_print(level, all, g_level.load(), policy(), id.rank, id.local_rank);
}

bool should_print(Level level, bool all, Level threshold, Policy policy, int rank, int local_rank) {
  if (level == Level::kOff || threshold == Level::kOff || level < threshold) return false;
  if (all || level >= Level::kWarn) return true;
  return policy == Policy::kLocalRank0 ? local_rank == 0 : rank == 0;
}

std::string decorate(Level level, bool all, int rank, int world_size, std::string_view message,
                     bool launcher_shows_rank) {
  std::string prefix;
  if (world_size > 1 && !launcher_shows_rank && (all || level >= Level::kWarn))
    prefix = "[rank " + std::to_string(rank) + "] ";
  switch (level) {
    case Level::kDebug:
      prefix += "DEBUG: ";
      break;
    case Level::kWarn:
      prefix += "WARNING: ";
      break;
    case Level::kError:
      prefix += "ERROR: ";
      break;
    default:
      break;
  }
  if (prefix.empty()) return std::string(message);
  // Every line carries the prefix, so grep by rank or level finds all of a message.
  std::string text;
  text.reserve(message.size() + prefix.size());
  std::size_t start = 0;
  while (true) {
    std::size_t end = message.find('\n', start);
    text += prefix;
    text.append(message.substr(
        start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) break;
    text += '\n';
    start = end + 1;
  }
  return text;
}

bool parse_level(std::string_view text, Level* level) {
  std::string lower;
  for (char c : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "debug" || lower == "trace") {
    *level = Level::kDebug;
  } else if (lower == "info") {
    *level = Level::kInfo;
  } else if (lower == "warn" || lower == "warning") {
    *level = Level::kWarn;
  } else if (lower == "error" || lower == "err") {
    *level = Level::kError;
  } else if (lower == "off" || lower == "none") {
    *level = Level::kOff;
  } else {
    return false;
  }
  return true;
}

void write(Level level, bool all, std::string_view message) {
  try {
    if (!enabled(level, all)) return;
    const Identity& id = identity();
    std::string text =
        decorate(level, all, id.rank, id.world_size, message, id.launcher_shows_rank);
    Loggers loggers = current_loggers();
    auto& logger = level >= Level::kWarn ? loggers.err : loggers.out;
    logger->log(to_spdlog(level), text);
  } catch (...) {
    // Logging never takes a worker down.
  }
}

namespace {

// spdlog's side of a LineSink: each formatted line, newline included.
class FunctionSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit FunctionSink(LineSink sink) : sink_(std::move(sink)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t text;
    formatter_->format(msg, text);
    sink_(std::string_view(text.data(), text.size()));
  }
  void flush_() override {}

 private:
  LineSink sink_;
};

}  // namespace

void set_sinks(LineSink out, LineSink err) {
  auto out_logger = make_logger("ddp.out", std::make_shared<FunctionSink>(std::move(out)));
  auto err_logger = make_logger("ddp.err", std::make_shared<FunctionSink>(std::move(err)));
  std::lock_guard<std::mutex> lock(g_sinks_mu);
  loggers_locked() = Loggers{std::move(out_logger), std::move(err_logger)};
}

void reset_sinks() {
  auto out = make_logger("ddp.out", std::make_shared<spdlog::sinks::stdout_sink_mt>());
  auto err = make_logger("ddp.err", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  std::lock_guard<std::mutex> lock(g_sinks_mu);
  loggers_locked() = Loggers{std::move(out), std::move(err)};
}

}  // namespace ddp::log
