#pragma once
// The wire format of torch.distributed.TCPStore (torch's
// csrc/distributed/c10d/TCPStore.cpp and store/TCPStoreBackend.{hpp,cpp},
// store/TCPStoreLibUvBackend.cpp), as its clients send it: a query is one
// byte, its type, then its arguments. Integers are sent raw, in the host's
// byte order; a string or byte vector is a uint64 length and its bytes; a
// list is a uint64 count and its items. Two dialects, told apart by a
// connection's first query:
//   - modern (the torch 2.x releases whose clients validate; checked against
//     2.15): the connection opens with VALIDATE and the magic 0x3C85F7CE,
//     then PING; types VALIDATE=0, SET,
//     COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND,
//     MULTI_GET, MULTI_SET, CANCEL_WAIT, PING, QUEUE_PUSH, QUEUE_POP,
//     QUEUE_LEN, LIST_KEYS, BARRIER=18;
//   - legacy (older clients, checked against Debian's 1.13): no VALIDATE;
//     types SET=0, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, WATCH_KEY,
//     DELETE_KEY, APPEND, MULTI_GET, MULTI_SET, CANCEL_WAIT=12. WATCH_KEY
//     (watchKey callbacks, C++ only) is not served.
// A connection whose first byte is 0 is modern when the magic follows, else
// legacy (a legacy SET: its key length would be the magic, over any limit).
//
// Pure functions, no I/O; thread-safe.

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::launcher::torch_store {

// The modern type codes.
enum class Op : std::uint8_t {
  kValidate,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kNumKeys,
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kCancelWait,
  kPing,
  kQueuePush,
  kQueuePop,
  kQueueLen,
  kListKeys,
  kBarrier,
};

enum class Dialect { kUnknown, kModern, kLegacy };

constexpr std::uint32_t kValidationMagic = 0x3C85F7CE;
// CHECK's answer, and WAIT's (and BARRIER's, CANCEL_WAIT's).
constexpr std::uint8_t kReady = 0, kNotReady = 1;
constexpr std::uint8_t kStopWaiting = 0, kWaitCanceled = 1;

// Whether a connection that begins with `byte` speaks TCPStore: every query
// type is below 19, and an HTTP/2 client begins with 'P'.
inline bool starts_query(std::uint8_t byte) {
  return byte <= static_cast<std::uint8_t>(Op::kBarrier);
}

// "SET", "WAIT", ... as torch names them.
const char* op_name(Op op);

struct Query {
  Op op = Op::kValidate;
  std::vector<std::string> keys;    // in the order sent
  std::vector<std::string> values;  // SET, APPEND, QUEUE_PUSH: one; COMPARE_SET: expected, desired;
                                    // MULTI_SET: one per key
  std::int64_t number = 0;          // ADD's delta, BARRIER's world size
  std::uint32_t nonce = 0;          // PING's nonce, VALIDATE's magic
};

struct WireLimits {
  std::size_t max_key_bytes = 4096;
  std::size_t max_value_bytes = 4u << 20;
  std::size_t max_query_bytes = 8u << 20;  // one query, every key and value in it
};

// A query that cannot be served: malformed, over a limit, of an unknown or
// unserved type. The connection is closed.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Decodes the query at the start of `bytes` in `dialect`; kUnknown (a
// connection's first query) is decided here and set. Returns the bytes the
// query took, or 0 when `bytes` holds only the beginning of one. Throws
// ProtocolError naming the query and the limit or byte at fault; a length
// over a limit is refused as soon as it arrives, before its bytes.
std::size_t decode(std::string_view bytes, Dialect& dialect, const WireLimits& limits,
                   Query& query);

// Replies, appended to `out` as torch's clients read them.
void put_u8(std::string& out, std::uint8_t value);
void put_u32(std::string& out, std::uint32_t value);
void put_i64(std::string& out, std::int64_t value);
void put_bytes(std::string& out, std::string_view bytes);  // uint64 length, then the bytes

// Encoding for clients (tests): a query as `dialect` sends it.
std::string encode(const Query& query, Dialect dialect);

}  // namespace ddp::launcher::torch_store
