#pragma once
// How the rendezvous state machine answers: a Status value, never an
// exception, because every refusal is an ordinary answer to a remote caller
// that the gRPC service maps one to one onto a status code (and the client
// turns back into ddp::RpcError, a ddp::Error). Also the limits and the
// caller's credentials every part of the state checks.

#include <chrono>
#include <cstddef>
#include <string>

namespace ddp::launcher {

using RendezvousClock = std::chrono::steady_clock;
using TimePoint = RendezvousClock::time_point;

// The service maps these one to one onto grpc::StatusCode.
enum class Code {
  kOk,
  kUnauthenticated,
  kInvalidArgument,
  kResourceExhausted,
  kDeadlineExceeded,
  kNotFound,
  kFailedPrecondition,
  kAborted,
  kUnavailable,  // try again later (a full round)
};
const char* code_name(Code code);  // "UNAUTHENTICATED", as gRPC spells it

// An error is a value: its message names the key, rank, node, run or limit.
struct Status {
  Code code = Code::kOk;
  std::string message;
  bool ok() const { return code == Code::kOk; }
};

// `value` is meaningful only when status.ok().
template <class T>
struct Result {
  Status status;
  T value{};
  bool ok() const { return status.ok(); }
};

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
