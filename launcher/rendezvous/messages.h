#pragma once
// Message text shared by the parts of the rendezvous state (internal).

#include <chrono>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/common/rendezvous_types.h"

namespace ddp::launcher {

// cat("rank ", 3, " of ", name): message text from strings and numbers.
template <class T>
std::string text_of(const T& part) {
  if constexpr (std::is_arithmetic_v<T>) {
    return std::to_string(part);
  } else {
    return std::string(part);
  }
}
template <class... Parts>
std::string cat(const Parts&... parts) {
  return (std::string() + ... + text_of(parts));
}
// throw refusal(RpcCode::kNotFound, "round ", n, " does not exist").
template <class... Parts>
RpcError refusal(RpcCode code, const Parts&... parts) {
  return RpcError(code, cat(parts...));
}

// "12.0s".
std::string seconds(std::chrono::nanoseconds d);
// A key, name or value as it appears in a message: quoted, at most 40 bytes,
// non-printable bytes escaped (keys may be binary).
std::string quote(const std::string& text);
// "rank 3" / "ranks 0-2, 5" from inclusive ranges; long lists are cut, since
// a barrier may span a million ranks.
std::string format_ranks(const std::vector<std::pair<int, int>>& ranges, long count);
std::string format_ranks(const std::vector<int>& sorted);
// How a message names a node's host: its hostname, else its address.
std::string host_of(const NodeInfo& args);
// Whether `joiner` is the node `was` started again: the same explicit node
// rank, or for assigned ranks the same hostname and address.
bool same_node(const NodeInfo& was, const NodeInfo& joiner);

}  // namespace ddp::launcher
