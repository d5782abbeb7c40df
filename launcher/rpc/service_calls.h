#pragma once
// What the rendezvous service's handlers share (internal to rpc/): the
// state's refusals as gRPC statuses, deadlines, and the waiters' topics.

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>

#include "ddp/common/error.h"
#include "ddp/v1/rendezvous.grpc.pb.h"
#include "rendezvous/rendezvous_state.h"

namespace ddp::launcher::service {

// Cap for waits whose request names no timeout.
inline constexpr auto kMaxWait = std::chrono::hours(24);

// gRPC carries a status message in trailing metadata, whose size is
// limited (8 KiB by default): a longer one would replace the real error with
// "received initial metadata size exceeds limit". Long texts (a Wait on
// thousands of keys, a job's 20-line failure report) keep their head.
inline constexpr std::size_t kMaxStatusMessage = 4096;

inline std::string capped(const std::string& message) {
  if (message.size() <= kMaxStatusMessage) return message;
  std::size_t cut = kMaxStatusMessage;
  while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80)
    --cut;  // whole UTF-8 characters
  return message.substr(0, cut) + "... (" + std::to_string(message.size() - cut) +
         " more bytes cut)";
}

inline grpc::Status error_status(grpc::StatusCode code, const std::string& message,
                                 const std::string& reason = {}) {
  return grpc::Status(code, capped(message), reason);
}

// Runs `call` on the state: OK, or the state's refusal as the gRPC status it names.
template <class Call>
grpc::Status status_of(Call&& call) {
  try {
    call();
    return grpc::Status::OK;
  } catch (const RpcError& refused) {
    return error_status(static_cast<grpc::StatusCode>(refused.code()), refused.what(),
                        refused.reason());
  }
}

inline Auth auth_of(const v1::Auth& a) { return {a.run_id(), a.token()}; }

inline TimePoint now() { return RendezvousClock::now(); }

inline TimePoint deadline_after(std::int64_t timeout_ms) {
  if (timeout_ms <= 0) return now() + kMaxWait;
  return now() +
         std::min<std::chrono::milliseconds>(std::chrono::milliseconds(timeout_ms), kMaxWait);
}

// Waiter topics (see RendezvousService::Waiter).
// "j": membership: the forming round, and the running round's end.
inline constexpr char kJoinTopic[] = "j";
inline constexpr std::chrono::milliseconds kMaxHeartbeatHold{10000};
inline std::string key_topic(const std::string& key) { return "k:" + key; }
inline std::string barrier_topic(const std::string& name) { return "b:" + name; }

// "1.5 s": a timeout in milliseconds, for messages.
inline std::string seconds_text(std::int64_t ms) {
  std::ostringstream out;
  out.precision(3);
  out << ms / 1000.0 << " s";
  return out.str();
}

}  // namespace ddp::launcher::service
