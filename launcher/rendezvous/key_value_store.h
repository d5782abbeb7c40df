#pragma once
// The rendezvous's key-value store (torch's TCPStore semantics), bounded by
// RendezvousLimits. Keys are any non-empty bytes ('/' included) up to
// max_key_bytes. Refusals throw ddp::RpcError and change nothing: an empty
// or oversized key or value is kInvalidArgument (a bad request, not a full
// server); a new key beyond max_keys, or a value that would take the store
// past max_store_bytes, is kResourceExhausted naming the --rdzv_conf key.
// Pure logic; callers check the caller's token first. Not thread-safe.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ddp/common/rendezvous_types.h"
#include "rendezvous/limits.h"

namespace ddp::launcher {

class KeyValueStore {
 public:
  explicit KeyValueStore(const RendezvousLimits& limits) : limits_(limits) {}

  void set(const std::string& key, const std::string& value);
  // nullopt when the key is missing; waiting is the service's job (re-poll).
  std::optional<std::string> get(const std::string& key) const;
  // The value is the decimal text of an int64, a missing key counts as 0.
  // Returns the new value. kInvalidArgument when the value is not an integer
  // or the sum overflows.
  std::int64_t add(const std::string& key, std::int64_t delta);
  // Sets `desired` when the key is missing and `expected` is empty, or when
  // the value equals `expected`.
  CompareSetOutcome compare_set(const std::string& key, const std::string& expected,
                                const std::string& desired);
  // Whether every key exists (true for no keys).
  bool check(const std::vector<std::string>& keys) const;
  // Whether the key existed.
  bool remove(const std::string& key);
  std::int64_t size() const { return static_cast<std::int64_t>(values_.size()); }
  // Every key, in byte order.
  std::vector<std::string> keys() const;
  // Removes every key (counts as one change).
  void clear();

  // Increments on every change (for the state's version()).
  std::uint64_t changes() const { return changes_; }
  std::string broken_invariant() const;  // "" when the byte count and limits hold

 private:
  // Each throws the refusal when its rule is broken.
  void check_key(const std::string& key) const;
  void check_value(const std::string& key, const std::string& value) const;
  // Whether `key` may hold a value of `value_bytes` (count and byte limits).
  void check_room(const std::string& key, std::size_t value_bytes) const;
  void put(const std::string& key, std::string value);  // keeps bytes_

  const RendezvousLimits& limits_;
  std::map<std::string, std::string> values_;
  std::size_t bytes_ = 0;  // keys and values together
  std::uint64_t changes_ = 0;
};

}  // namespace ddp::launcher
