#pragma once
// The one error type of ddprun and libddp. Its message always names the thing
// that is wrong (flag, rank, key, endpoint, variable), so callers print it as is.
//
// RpcError is the same error carrying a gRPC status code: what the rendezvous
// state refuses a request with (the service answers it with that code) and
// what RendezvousClient throws when a call fails (the server's code, or one
// of its own: kDeadlineExceeded, kCancelled, kUnavailable).

#include <stdexcept>
#include <string>
#include <utility>

namespace ddp {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// The gRPC status codes ddprun answers with or acts on (the numbers of
// grpc::StatusCode, so they convert both ways with a cast).
enum class RpcCode : int {
  kOk = 0,
  kCancelled = 1,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kUnavailable = 14,
  kUnauthenticated = 16,
};

// "UNAUTHENTICATED", as gRPC spells it; "gRPC code N" for codes not listed above.
std::string rpc_code_name(int code);

// `reason`: a refusal's kind for programs to test (carried as the gRPC
// status's details), beside the code; empty when it has none. One of the
// kReason constants below.
class RpcError : public Error {
 public:
  RpcError(int code, const std::string& message, std::string reason = {})
      : Error(message), code_(code), reason_(std::move(reason)) {}
  RpcError(RpcCode code, const std::string& message, std::string reason = {})
      : RpcError(static_cast<int>(code), message, std::move(reason)) {}
  int code() const { return code_; }
  bool is(RpcCode code) const { return code_ == static_cast<int>(code); }
  const std::string& reason() const { return reason_; }

 private:
  int code_;
  std::string reason_;
};

// The round a node asked to join is full (kUnavailable): it may wait for a later one.
inline constexpr const char* kReasonRoundFull = "round_full";

}  // namespace ddp
