// torch's TCPStore wire format (launcher/store/torch_store_protocol.h): every
// query decodes from its bytes in both dialects, whatever piece of it has
// arrived (TCP splits queries anywhere), and a connection's dialect is
// decided only by a complete first query.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "store/torch_store_protocol.h"

namespace ddp::launcher::torch_store {
namespace {

Query make(Op op, std::vector<std::string> keys = {}, std::vector<std::string> values = {},
           std::int64_t number = 0, std::uint32_t nonce = 0) {
  Query q;
  q.op = op;
  q.keys = std::move(keys);
  q.values = std::move(values);
  q.number = number;
  q.nonce = nonce;
  return q;
}

// One query of each type, with arguments of its shape.
std::vector<Query> every_query() {
  return {make(Op::kSet, {"/k"}, {"v"}),
          make(Op::kCompareSet, {"/k"}, {"", "new"}),
          make(Op::kGet, {"/k"}),
          make(Op::kAdd, {"/n"}, {}, -7),
          make(Op::kCheck, {"/a", "/b"}),
          make(Op::kWait, {"/a"}),
          make(Op::kNumKeys),
          make(Op::kDeleteKey, {"/k"}),
          make(Op::kAppend, {"/log"}, {std::string("\0\1", 2)}),
          make(Op::kMultiGet, {"/a", "/b", "/c"}),
          make(Op::kMultiSet, {"/a", "/b"}, {"1", ""}),
          make(Op::kCancelWait),
          make(Op::kPing, {}, {}, 0, 12345),
          make(Op::kQueuePush, {"/q"}, {"item"}),
          make(Op::kQueuePop, {"/q"}),
          make(Op::kQueueLen, {"/q"}),
          make(Op::kListKeys),
          make(Op::kBarrier, {"/b"}, {}, 4)};
}

bool legacy_has(Op op) { return op <= Op::kCancelWait; }

void expect_same(const Query& got, const Query& want) {
  EXPECT_EQ(got.op, want.op) << op_name(want.op);
  EXPECT_EQ(got.keys, want.keys) << op_name(want.op);
  EXPECT_EQ(got.values, want.values) << op_name(want.op);
  EXPECT_EQ(got.number, want.number) << op_name(want.op);
  EXPECT_EQ(got.nonce, want.nonce) << op_name(want.op);
}

TEST(TorchStoreProtocol, EveryQueryDecodesFromEveryPieceThatArrives) {
  const WireLimits limits;
  const Query validate = make(Op::kValidate, {}, {}, 0, kValidationMagic);
  for (Dialect dialect : {Dialect::kModern, Dialect::kLegacy}) {
    for (const Query& want : every_query()) {
      if (dialect == Dialect::kLegacy && !legacy_has(want.op)) continue;
      // A modern connection's first query is VALIDATE; a legacy one starts with the query itself.
      const std::string opening = dialect == Dialect::kModern ? encode(validate, dialect) : "";
      const std::string bytes = opening + encode(want, dialect);
      Dialect d = Dialect::kUnknown;
      Query got;
      for (std::size_t n = 0; n < opening.size(); ++n) {
        ASSERT_EQ(decode(std::string_view(bytes).substr(0, n), d, limits, got), 0u) << n;
        EXPECT_EQ(d, Dialect::kUnknown) << "decided on " << n << " bytes";
      }
      std::size_t used = 0;
      if (!opening.empty()) {
        used = decode(bytes, d, limits, got);
        ASSERT_EQ(used, opening.size());
        EXPECT_EQ(got.op, Op::kValidate);
      }
      for (std::size_t n = used; n < bytes.size(); ++n) {
        Dialect before = d;
        ASSERT_EQ(decode(std::string_view(bytes).substr(used, n - used), before, limits, got), 0u)
            << op_name(want.op) << " from " << n - used << " bytes";
      }
      ASSERT_EQ(decode(std::string_view(bytes).substr(used), d, limits, got), bytes.size() - used)
          << op_name(want.op);
      EXPECT_EQ(d, dialect) << op_name(want.op);
      expect_same(got, want);
    }
  }
}

TEST(TorchStoreProtocol, ALegacySetIsNotTakenForValidate) {
  const WireLimits limits;
  const std::string bytes = encode(make(Op::kSet, {"/k"}, {"v"}), Dialect::kLegacy);
  ASSERT_EQ(bytes[0], '\0');  // SET's legacy code is VALIDATE's modern one
  Dialect d = Dialect::kUnknown;
  Query got;
  EXPECT_EQ(decode(bytes, d, limits, got), bytes.size());
  EXPECT_EQ(d, Dialect::kLegacy);
  EXPECT_EQ(got.op, Op::kSet);
  EXPECT_EQ(got.values, std::vector<std::string>{"v"});
}

TEST(TorchStoreProtocol, QueriesThatArriveTogetherAreTakenOneByOne) {
  const WireLimits limits;
  const std::string bytes =
      encode(make(Op::kValidate, {}, {}, 0, kValidationMagic), Dialect::kModern) +
      encode(make(Op::kAdd, {"/n"}, {}, 1), Dialect::kModern) +
      encode(make(Op::kGet, {"/n"}), Dialect::kModern);
  Dialect d = Dialect::kUnknown;
  Query got;
  std::size_t at = 0;
  std::vector<Op> ops;
  while (std::size_t n = decode(std::string_view(bytes).substr(at), d, limits, got)) {
    at += n;
    ops.push_back(got.op);
  }
  EXPECT_EQ(at, bytes.size());
  EXPECT_EQ(ops, (std::vector<Op>{Op::kValidate, Op::kAdd, Op::kGet}));
}

TEST(TorchStoreProtocol, ALengthOverALimitIsRefusedBeforeItsBytesArrive) {
  WireLimits limits;
  limits.max_key_bytes = 8;
  limits.max_value_bytes = 16;
  limits.max_query_bytes = 64;
  auto refused = [&](const std::string& bytes) {
    Dialect d = Dialect::kModern;
    Query got;
    try {
      decode(bytes, d, limits, got);
    } catch (const ProtocolError& e) {
      return std::string(e.what());
    }
    return std::string("not refused");
  };
  auto u64 = [](std::uint64_t n) {
    return std::string(reinterpret_cast<const char*>(&n), sizeof n);
  };
  EXPECT_EQ(refused("\x03" + u64(9)),
            "query GET: key of 9 bytes, limit 8 (--rdzv_conf max_key_bytes)");
  EXPECT_EQ(refused("\x01" + u64(2) + "/k" + u64(17)),
            "query SET: value of 17 bytes, limit 16 (--rdzv_conf max_value_bytes)");
  EXPECT_EQ(refused("\x0b" + u64(3) + u64(2) + "/a" + u64(16) + std::string(16, 'x') + u64(2) +
                    "/b" + u64(16)),
            "query MULTI_SET: over 64 bytes (--rdzv_conf max_message_bytes)");
  EXPECT_EQ(refused(std::string("\x06") + u64(9)), "query WAIT: a list of 9 items");
  EXPECT_EQ(refused(std::string(1, '\x13')), "unknown query type 19");
}

}  // namespace
}  // namespace ddp::launcher::torch_store
