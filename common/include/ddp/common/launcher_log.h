#pragma once
// Process-wide logger for ddprun's own messages (not the workers' output).
// Messages go to stderr as "[ddprun] text" ("[ddprun] WARNING: text" for
// warnings). Thread-safe (spdlog's mutex sink).

#include <spdlog/spdlog.h>

namespace ddp {

// The launcher's logger; created on first use.
spdlog::logger& launcher_log();

}  // namespace ddp
