#pragma once
// What every part of the rendezvous state shares: its clock, the caller's
// credentials, and the limits it enforces. A part refuses a request by
// throwing ddp::RpcError (ddp/common/error.h) with the gRPC code the service
// answers with and a message naming the key, rank, node, run or limit.

#include <chrono>
#include <cstddef>
#include <string>

namespace ddp::launcher {

using RendezvousClock = std::chrono::steady_clock;
using TimePoint = RendezvousClock::time_point;

struct Auth {
  std::string run_id;
  std::string token;
};

struct RendezvousLimits {
  std::size_t max_key_bytes = 4096;  // also bounds barrier names
  std::size_t max_value_bytes = 4u << 20;
  std::size_t max_keys = 100000;
  // Keys and values together: the store's memory is bounded whatever the
  // mix of sizes (max_keys x max_value_bytes alone would allow 400 GB).
  std::size_t max_store_bytes = 256u << 20;
  // Requests the service holds at once (waiting Gets and Waits, joins,
  // barriers, held heartbeats): each costs a gRPC call's memory (~16 KiB).
  std::size_t max_pending_waits = 32768;
  // Bounds a round's world size (sum of local world sizes) and a barrier's.
  int max_world_size = 1 << 20;
  std::size_t max_open_barriers = 10000;
};

}  // namespace ddp::launcher
