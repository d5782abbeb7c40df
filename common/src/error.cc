#include "ddp/common/error.h"

namespace ddp {

std::string rpc_code_name(int code) {
  switch (static_cast<RpcCode>(code)) {
    case RpcCode::kOk:
      return "OK";
    case RpcCode::kCancelled:
      return "CANCELLED";
    case RpcCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case RpcCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case RpcCode::kNotFound:
      return "NOT_FOUND";
    case RpcCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case RpcCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case RpcCode::kAborted:
      return "ABORTED";
    case RpcCode::kUnavailable:
      return "UNAVAILABLE";
    case RpcCode::kUnauthenticated:
      return "UNAUTHENTICATED";
  }
  return "gRPC code " + std::to_string(code);
}

}  // namespace ddp
