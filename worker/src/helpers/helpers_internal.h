#pragma once
// What the helpers (metrics.cc, params.cc, c_api.cc) share (internal): the
// group a default-group helper uses, a byte encoding of descriptions, and the
// "compare cheaply, explain on mismatch" gather every consistency check uses.

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/ddp.h"
#include "ddp/process_group.h"

namespace ddp::detail {

// The default group, or nullptr in a world of one without ddp::init() (the
// helpers are then local no-ops, like the Python helpers when
// torch.distributed is not initialized). A distributed process that has not
// called ddp::init() gets an error naming `what`.
inline ProcessGroup* helper_group(const char* what) {
  if (is_initialized()) return &default_group();
  if (!is_distributed()) return nullptr;
  throw Error(std::string(what) + ": ddp::init() has not been called (WORLD_SIZE=" +
              std::to_string(world_size()) + ", RANK=" + std::to_string(rank()) + ")");
}

// A length-prefixed binary encoding (every rank runs the same build on the
// same kind of machine, so native byte order is fine).
class Encoder {
 public:
  void i64(std::int64_t v) { bytes_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void str(const std::string& s) {
    i64(static_cast<std::int64_t>(s.size()));
    bytes_ += s;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

class Decoder {
 public:
  Decoder(const std::string& bytes, std::string what) : bytes_(bytes), what_(std::move(what)) {}
  std::int64_t i64() {
    need(sizeof(std::int64_t));
    std::int64_t v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::string str() {
    std::int64_t n = i64();
    if (n < 0) fail();
    need(static_cast<std::size_t>(n));
    std::string s = bytes_.substr(pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }
  bool done() const { return pos_ == bytes_.size(); }

 private:
  void need(std::size_t n) {
    if (bytes_.size() - pos_ < n) fail();
  }
  [[noreturn]] void fail() {
    throw Error(what_ + ": a malformed description came from another rank");
  }
  const std::string& bytes_;
  std::string what_;
  std::size_t pos_ = 0;
};

// FNV-1a, 64 bits: a fingerprint of a description, not a security boundary.
inline std::int64_t fingerprint(const std::string& bytes) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return static_cast<std::int64_t>(h);
}

// Every rank calls this with its description. Returns nullopt when every
// rank's description is the same (one small all_gather), else every rank's
// description (all_gather_object). Every rank sees the same gathered values,
// so every rank takes the same path: a mismatch is reported, never a hang.
inline std::optional<std::vector<std::string>> gather_if_different(ProcessGroup& group,
                                                                   const std::string& description) {
  std::int64_t mine[2] = {fingerprint(description), static_cast<std::int64_t>(description.size())};
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(group.size()));
  group.all_gather(mine, all.data(), 2, DType::kInt64);
  bool same = true;
  for (int r = 1; r < group.size(); ++r) {
    same = same && all[2 * r] == all[0] && all[2 * r + 1] == all[1];
  }
  if (same) return std::nullopt;
  return group.all_gather_object(description);
}

// The rank whose description most ranks share (ties: the lowest such rank),
// so a lone rank 0 that differs is the one named, not everyone else.
inline int majority_rank(const std::vector<std::string>& all) {
  int best = 0, most = 0;
  for (std::size_t r = 0; r < all.size(); ++r) {
    int same = 0;
    for (const auto& other : all) same += other == all[r] ? 1 : 0;
    if (same > most) {
      most = same;
      best = static_cast<int>(r);
    }
  }
  return best;
}

// "1", "1, 2", ...
inline std::string join_ranks(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

}  // namespace ddp::detail
