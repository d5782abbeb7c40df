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

// Which of torch 2.x's rendezvous handlers torchrun gives a command line
// (torch/distributed/run.py): torchrun's own spellings of a key mean
// something only where that handler reads them.
//   kStatic: StaticTCPRendezvous, which reads `timeout` (and `rank`, which
//            torchrun overwrites with --node_rank) and nothing else.
//   kC10d:   DynamicRendezvousHandler over the c10d backend, which reads
//            join_timeout, last_call_timeout, close_timeout,
//            heartbeat_timeout, keep_alive_interval, keep_alive_max_attempt,
//            cas_backoff_max_seconds, is_host, read_timeout and store_type.
enum class TorchHandler { kStatic, kC10d };

// What of a command line decides the handler.
struct TorchrunShape {
  std::string backend{};  // --rdzv_backend as given ("" when not)
  bool standalone = false;
  bool endpoint_given = false;       // --rdzv_endpoint
  bool master_port_given = false;    // --master_port
  bool node_rank_given = false;      // --node_rank
  int min_nodes = 1, max_nodes = 1;  // --nnodes
};

// torchrun's choice: --standalone is c10d, a backend named is that backend,
// except that static on one node without --master_port or --rdzv_endpoint
// becomes c10d (so does the default there). Without a backend, several
// nodes get ddprun's default (static with --node_rank and a fixed --nnodes,
// else c10d), which is torchrun's static wherever that can run: its static
// form needs every node's --node_rank and waits for a fixed number.
TorchHandler torch_handler(const TorchrunShape& shape);

// Throws ddp::Error naming --rdzv_conf and the key when a value is malformed.
// Keys and values are stripped of spaces around them, as torchrun does.
// ddprun's keys (join_timeout, last_call_timeout, heartbeat_interval,
// heartbeat_timeout, close_timeout, read_timeout, the max_* limits) apply
// under either handler. torchrun's own spellings apply where `handler`
// reads them, as under torchrun, and elsewhere add a line to `notices`:
// timeout (the static form's join_timeout; it wins over join_timeout there),
// keep_alive_interval (= heartbeat_interval) and keep_alive_max_attempt
// (heartbeat_timeout = interval x attempts, unless heartbeat_timeout is
// given) under c10d only; is_host under c10d only (under static, node rank 0
// hosts). Keys with no effect here (use_libuv, store_type,
// cas_backoff_max_seconds, rank, and any other, as torchrun keeps unknown
// keys for custom backends) add a line to `notices` too.
RdzvConf parse_rdzv_conf(const std::string& text, TorchHandler handler,
                         std::vector<std::string>* notices = nullptr);

}  // namespace ddp::launcher
