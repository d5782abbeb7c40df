#pragma once
// Rank-aware logging for worker processes (what `print(..., all=False)` does
// in the usual PyTorch DDP helpers).
//
//   ddp::log::info("epoch {} loss {:.4f}", epoch, loss);   // rank 0 only
//   ddp::log::info_all("loaded shard {}", shard);            // every rank, "[rank N] "
//   ddp::log::warn("skipping batch {}", i);                  // every rank, stderr
//
// Rules:
// - info/debug print on the logging rank only: rank 0 (Policy::kRank0, the
//   default) or local rank 0 of every node (Policy::kLocalRank0), as plain
//   lines on stdout.
// - info_all/debug_all print on every rank, each line prefixed "[rank N] ".
// - warn/error always print, from any rank, on stderr, prefixed
//   "[rank N] WARNING: " / "[rank N] ERROR: ".
// - In a world of one there is no "[rank N] " prefix (nothing to tell apart).
// - Lines below the level (default info; DDP_LOG_LEVEL=debug|info|warn|error|off)
//   are dropped before they are formatted.
// A message of several lines gets the prefix on each line. Every line is
// flushed at once, so the launcher's log tee sees it promptly. The rank comes
// from the environment contract, so logging works before ddp::init().
// Thread-safe. Never throws (a logging failure is dropped, not raised).

#include <fmt/format.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace ddp::log {

enum class Level : int { kDebug, kInfo, kWarn, kError, kOff };
enum class Policy : int { kRank0, kLocalRank0 };

// Which rank(s) print info/debug lines.
void set_policy(Policy policy);
Policy policy();
// Lines below `level` are dropped (kOff drops everything).
void set_level(Level level);
Level level();
// Whether this process prints info/debug lines under the current policy.
bool is_logging_rank();
// Whether a line of `level` (with `all` = every rank) would print here.
bool enabled(Level level, bool all = false);

// Writes a formatted message under the rules above (what info() & co call).
void write(Level level, bool all, std::string_view message);

template <typename... Args>
void debug(fmt::format_string<Args...> format, Args&&... args) {
  if (enabled(Level::kDebug))
    write(Level::kDebug, false, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void debug_all(fmt::format_string<Args...> format, Args&&... args) {
  if (enabled(Level::kDebug, true))
    write(Level::kDebug, true, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void info(fmt::format_string<Args...> format, Args&&... args) {
  if (enabled(Level::kInfo))
    write(Level::kInfo, false, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void info_all(fmt::format_string<Args...> format, Args&&... args) {
  if (enabled(Level::kInfo, true))
    write(Level::kInfo, true, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void warn(fmt::format_string<Args...> format, Args&&... args) {
  if (enabled(Level::kWarn, true))
    write(Level::kWarn, true, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void error(fmt::format_string<Args...> format, Args&&... args) {
  if (enabled(Level::kError, true))
    write(Level::kError, true, fmt::format(format, std::forward<Args>(args)...));
}

// Receives written text: one line at a time, ending with '\n'. Calls to
// one sink never overlap (they are serialised), and must not log.
using LineSink = std::function<void(std::string_view line)>;
// Sends info/debug lines to `out` and warnings/errors to `err` instead of
// stdout/stderr (tests, or a file). reset_sinks() restores the console.
void set_sinks(LineSink out, LineSink err);
void reset_sinks();

}  // namespace ddp::log
