#include "observe/event_record.h"

#include <fmt/format.h>

#include "observe/job_status.h"

namespace ddp::launcher {

std::string format_event(const EventRecord& e) {
  std::string out =
      fmt::format("{{\"name\":{},\"source\":{},\"timestamp\":{},\"run_id\":{}", json_quote(e.name),
                  json_quote(e.source), e.timestamp_ms, json_quote(e.run_id));
  auto text = [&](const char* key, const std::string& value) {
    if (!value.empty()) out += fmt::format(",\"{}\":{}", key, json_quote(value));
  };
  auto number = [&](const char* key, const std::optional<int>& value) {
    if (value) out += fmt::format(",\"{}\":{}", key, *value);
  };
  text("hostname", e.hostname);
  text("role", e.role);
  out += fmt::format(",\"round\":{},\"group_rank\":{}", e.round, e.group_rank);
  number("global_rank", e.global_rank);
  number("local_rank", e.local_rank);
  number("pid", e.pid);
  text("state", e.state);
  number("exit_code", e.exit_code);
  number("signal", e.signal);
  number("restart_count", e.restart_count);
  text("message", e.message);
  return out + "}\n";
}

}  // namespace ddp::launcher
