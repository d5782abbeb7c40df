#include "ddp/common/launcher_log.h"

#include <spdlog/sinks/stdout_sinks.h>

namespace ddp {

spdlog::logger& launcher_log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    auto l = std::make_shared<spdlog::logger>("ddprun", sink);
    // Warnings and errors say so; info lines stay short.
    l->set_pattern("[ddprun] %^%v%$");
    l->set_level(spdlog::level::info);
    l->flush_on(spdlog::level::trace);
    return l;
  }();
  return *logger;
}

}  // namespace ddp
