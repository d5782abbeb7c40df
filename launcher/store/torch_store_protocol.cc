#include "store/torch_store_protocol.h"

#include <array>
#include <cstring>
#include <optional>

namespace ddp::launcher::torch_store {
namespace {

constexpr std::uint8_t kLegacyWatchKey = 7;
// Legacy type code -> the same query's Op (WATCH_KEY has none).
constexpr std::array<std::optional<Op>, 13> kLegacyOps = {
    Op::kSet,      Op::kCompareSet, Op::kGet,        Op::kAdd,       Op::kCheck,
    Op::kWait,     Op::kNumKeys,    std::nullopt,    Op::kDeleteKey, Op::kAppend,
    Op::kMultiGet, Op::kMultiSet,   Op::kCancelWait,
};

// What follows a query's type byte.
enum class Shape {
  kNothing,
  kNonce,
  kKey,
  kKeyValue,
  kKeyTwoValues,
  kKeyNumber,
  kKeys,
  kKeyValuePairs
};

Shape shape_of(Op op) {
  switch (op) {
    case Op::kValidate:
    case Op::kPing:
      return Shape::kNonce;
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      return Shape::kKeyValue;
    case Op::kCompareSet:
      return Shape::kKeyTwoValues;
    case Op::kGet:
    case Op::kDeleteKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
      return Shape::kKey;
    case Op::kAdd:
    case Op::kBarrier:
      return Shape::kKeyNumber;
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      return Shape::kKeys;
    case Op::kMultiSet:
      return Shape::kKeyValuePairs;
    case Op::kNumKeys:
    case Op::kCancelWait:
    case Op::kListKeys:
      return Shape::kNothing;
  }
  return Shape::kNothing;
}

// Reads the arguments of one query from `bytes` (after its type byte). Each
// read returns false when the bytes end first; a length over a limit throws.
class Reader {
 public:
  Reader(std::string_view bytes, const WireLimits& limits, Op op)
      : bytes_(bytes), limits_(limits), op_(op) {}

  std::size_t used() const { return pos_; }

  template <class T>
  bool value(T& out) {
    if (bytes_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(&out, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool key(std::string& out) { return text(out, limits_.max_key_bytes, "key", "max_key_bytes"); }
  bool payload(std::string& out) {
    return text(out, limits_.max_value_bytes, "value", "max_value_bytes");
  }
  // A list's count: each item takes at least its 8-byte length.
  bool count(std::uint64_t& n) {
    if (!value(n)) return false;
    if (n > limits_.max_query_bytes / 8) fail("a list of " + std::to_string(n) + " items");
    return true;
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw ProtocolError(std::string("query ") + op_name(op_) + ": " + what);
  }

 private:
  bool text(std::string& out, std::size_t limit, const char* kind, const char* conf_key) {
    std::uint64_t n = 0;
    if (!value(n)) return false;
    if (n > limit) {
      fail(std::string(kind) + " of " + std::to_string(n) + " bytes, limit " +
           std::to_string(limit) + " (--rdzv_conf " + conf_key + ")");
    }
    if (pos_ + n > limits_.max_query_bytes) {
      fail("over " + std::to_string(limits_.max_query_bytes) +
           " bytes (--rdzv_conf max_message_bytes)");
    }
    if (bytes_.size() - pos_ < n) return false;
    out.assign(bytes_.data() + pos_, n);
    pos_ += n;
    return true;
  }

  std::string_view bytes_;
  const WireLimits& limits_;
  Op op_;
  std::size_t pos_ = 0;
};

bool read_keys(Reader& in, Query& q, bool with_values) {
  std::uint64_t n = 0;
  if (!in.count(n)) return false;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::string key, value;
    if (!in.key(key)) return false;
    if (with_values && !in.payload(value)) return false;
    q.keys.push_back(std::move(key));
    if (with_values) q.values.push_back(std::move(value));
  }
  return true;
}

// The query's arguments; false when incomplete.
bool read_arguments(Reader& in, Query& q) {
  std::string key, value;
  switch (shape_of(q.op)) {
    case Shape::kNothing:
      return true;
    case Shape::kNonce:
      return in.value(q.nonce);
    case Shape::kKeys:
      return read_keys(in, q, false);
    case Shape::kKeyValuePairs:
      return read_keys(in, q, true);
    default:
      break;
  }
  if (!in.key(key)) return false;
  q.keys.push_back(std::move(key));
  switch (shape_of(q.op)) {
    case Shape::kKeyNumber:
      return in.value(q.number);
    case Shape::kKeyTwoValues:
      if (!in.payload(value)) return false;
      q.values.push_back(std::move(value));
      [[fallthrough]];
    case Shape::kKeyValue:
      if (!in.payload(value)) return false;
      q.values.push_back(std::move(value));
      return true;
    default:
      return true;  // kKey
  }
}

// The Op of type byte `type` in `dialect`; throws for an unknown or unserved type.
Op op_of(std::uint8_t type, Dialect dialect, bool first) {
  if (dialect == Dialect::kModern) {
    if (!starts_query(type)) throw ProtocolError("unknown query type " + std::to_string(type));
    const Op op = static_cast<Op>(type);
    if (op == Op::kValidate && !first)
      throw ProtocolError("query VALIDATE after the connection's first query");
    return op;
  }
  if (type == kLegacyWatchKey)
    throw ProtocolError("query WATCH_KEY (torch's watch_key callbacks) is not served");
  if (type >= kLegacyOps.size()) {
    throw ProtocolError("unknown query type " + std::to_string(type) +
                        (first ? " (not a TCPStore client?)" : ""));
  }
  return *kLegacyOps[type];
}

std::uint8_t type_of(Op op, Dialect dialect) {
  if (dialect != Dialect::kLegacy) return static_cast<std::uint8_t>(op);
  for (std::size_t i = 0; i < kLegacyOps.size(); ++i) {
    if (kLegacyOps[i] == op) return static_cast<std::uint8_t>(i);
  }
  throw ProtocolError(std::string("query ") + op_name(op) + " has no legacy type code");
}

}  // namespace

const char* op_name(Op op) {
  static constexpr const char* kNames[] = {
      "VALIDATE",   "SET",        "COMPARE_SET", "GET",       "ADD",       "CHECK",       "WAIT",
      "GETNUMKEYS", "DELETE_KEY", "APPEND",      "MULTI_GET", "MULTI_SET", "CANCEL_WAIT", "PING",
      "QUEUE_PUSH", "QUEUE_POP",  "QUEUE_LEN",   "LIST_KEYS", "BARRIER"};
  const auto i = static_cast<std::size_t>(op);
  return i < std::size(kNames) ? kNames[i] : "?";
}

std::size_t decode(std::string_view bytes, Dialect& dialect, const WireLimits& limits,
                   Query& query) {
  if (bytes.empty()) return 0;
  const auto type = static_cast<std::uint8_t>(bytes[0]);
  const bool first = dialect == Dialect::kUnknown;
  Dialect d = dialect;
  if (first) {
    // Decided again until the first query is complete: `dialect` is only set then.
    if (type != 0) {
      d = Dialect::kLegacy;
    } else {
      std::uint32_t magic = 0;
      if (bytes.size() < 1 + sizeof magic) return 0;
      std::memcpy(&magic, bytes.data() + 1, sizeof magic);
      d = magic == kValidationMagic ? Dialect::kModern : Dialect::kLegacy;
    }
  }
  Query q;
  q.op = op_of(type, d, first);
  Reader in(bytes.substr(1), limits, q.op);
  if (!read_arguments(in, q)) {
    if (bytes.size() > limits.max_query_bytes)
      in.fail("over " + std::to_string(limits.max_query_bytes) + " bytes");
    return 0;
  }
  query = std::move(q);
  dialect = d;
  return 1 + in.used();
}

void put_u8(std::string& out, std::uint8_t value) { out.push_back(static_cast<char>(value)); }

void put_u32(std::string& out, std::uint32_t value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

void put_i64(std::string& out, std::int64_t value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

void put_bytes(std::string& out, std::string_view bytes) {
  const std::uint64_t n = bytes.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out.append(bytes);
}

std::string encode(const Query& query, Dialect dialect) {
  std::string out;
  put_u8(out, type_of(query.op, dialect));
  const Shape shape = shape_of(query.op);
  if (shape == Shape::kNonce) put_u32(out, query.nonce);
  if (shape == Shape::kKeys || shape == Shape::kKeyValuePairs)
    put_i64(out, static_cast<std::int64_t>(query.keys.size()));
  if (shape == Shape::kNothing || shape == Shape::kNonce) return out;
  for (std::size_t i = 0; i < query.keys.size(); ++i) {
    put_bytes(out, query.keys[i]);
    if (shape == Shape::kKeyValuePairs) put_bytes(out, query.values.at(i));
  }
  if (shape == Shape::kKeyNumber) put_i64(out, query.number);
  if (shape == Shape::kKeyValue || shape == Shape::kKeyTwoValues) {
    for (const std::string& value : query.values) put_bytes(out, value);
  }
  return out;
}

}  // namespace ddp::launcher::torch_store
