#pragma once
// --rdzv_conf: the rendezvous's key=value settings, parsed and checked
// (pure; errors are ddp::Error naming --rdzv_conf and the key).

#include <optional>
#include <string>
#include <vector>

namespace ddp::launcher {

// --rdzv_conf key=value,...: durations in seconds, limits in bytes or counts.
struct RdzvConf {
  double join_timeout_s = 600;
  double last_call_timeout_s = 30;  // torchrun's default
  double heartbeat_interval_s = 1;
  double heartbeat_timeout_s = 10;
  long long max_key_bytes = 4096;
  long long max_value_bytes = 4 << 20;
  long long max_keys = 100000;
  long long max_store_bytes = 256 << 20;  // keys and values together
  long long max_pending_waits = 32768;    // requests the server holds at once
  long long max_message_bytes = 8 << 20;  // gRPC messages the server accepts
  // torchrun's is_host: whether this node hosts the c10d rendezvous
  // (nullopt: the node whose address matches the endpoint's host does).
  std::optional<bool> is_host;
  // torchrun's close_timeout: how long the host keeps answering once the
  // job's outcome is known, so the other nodes' heartbeats learn it.
  std::optional<double> close_timeout_s;
  // torchrun's read_timeout: bound of the agent's short rendezvous calls
  // (reporting a failure, leaving).
  double read_timeout_s = 60;
};

// Throws ddp::Error naming --rdzv_conf and the key when a value is malformed.
// torchrun's keys are accepted with their meaning: timeout (= join_timeout),
// last_call_timeout, close_timeout, read_timeout, is_host,
// keep_alive_interval (= heartbeat_interval) and keep_alive_max_attempt
// (heartbeat_timeout = interval x attempts, unless heartbeat_timeout is
// given). Keys with no effect here (use_libuv, store_type, and any other, as
// torchrun keeps unknown keys for custom backends) add a line to `notices`.
RdzvConf parse_rdzv_conf(const std::string& text, std::vector<std::string>* notices = nullptr);

}  // namespace ddp::launcher
