#pragma once
// The logging rules of ddp/log.h as pure functions: what write() applies,
// given this process's rank, local rank and world size (unit-tested alone).

#include <string>
#include <string_view>

#include "ddp/log.h"

namespace ddp::log {

// The rules as pure functions (what write() applies, given this process's
// rank, local rank and world size).
bool should_print(Level level, bool all, Level threshold, Policy policy, int rank, int local_rank);
// The text written: `message` with the prefix of `level` on every line, no
// trailing newline. E.g. decorate(kWarn, true, 2, 4, "x") == "[rank 2] WARNING: x".
// `launcher_shows_rank` (ddprun prefixing the worker's lines itself,
// DDP_OUTPUT_PREFIXED=1) leaves "[rank N] " out: "WARNING: x".
std::string decorate(Level level, bool all, int rank, int world_size, std::string_view message,
                     bool launcher_shows_rank = false);
// "debug", "info", "warn"/"warning", "error", "off" (any case) -> Level; false if unknown.
bool parse_level(std::string_view text, Level* level);

}  // namespace ddp::log
