#include "rendezvous/key_value_store.h"

#include <charconv>

#include "rendezvous/messages.h"

namespace ddp::launcher {

void KeyValueStore::check_key(const std::string& key) const {
  if (key.empty()) throw refusal(RpcCode::kInvalidArgument, "key is empty");
  if (key.size() > limits_.max_key_bytes) {
    throw refusal(RpcCode::kInvalidArgument, "key ", quote(key), " is ", key.size(),
                  " bytes, limit ", limits_.max_key_bytes);
  }
}

void KeyValueStore::check_value(const std::string& key, const std::string& value) const {
  if (value.size() > limits_.max_value_bytes) {
    throw refusal(RpcCode::kInvalidArgument, "value of key ", quote(key), " is ", value.size(),
                  " bytes, limit ", limits_.max_value_bytes);
  }
}

void KeyValueStore::check_room(const std::string& key, std::size_t value_bytes) const {
  auto it = values_.find(key);
  if (values_.size() >= limits_.max_keys && it == values_.end()) {
    throw refusal(RpcCode::kResourceExhausted, "cannot add key ", quote(key), ": the store holds ",
                  values_.size(), " keys, limit ", limits_.max_keys, " (--rdzv_conf max_keys)");
  }
  const std::size_t freed = it == values_.end() ? 0 : it->first.size() + it->second.size();
  const std::size_t after = bytes_ - freed + key.size() + value_bytes;
  if (after > limits_.max_store_bytes && after > bytes_) {
    throw refusal(RpcCode::kResourceExhausted, "cannot set key ", quote(key), " (", value_bytes,
                  " bytes): the store would hold ", after, " bytes, limit ",
                  limits_.max_store_bytes, " (--rdzv_conf max_store_bytes)");
  }
}

void KeyValueStore::put(const std::string& key, std::string value) {
  auto [it, added] = values_.try_emplace(key);
  bytes_ -= added ? 0 : it->first.size() + it->second.size();
  it->second = std::move(value);
  bytes_ += it->first.size() + it->second.size();
  ++changes_;
}

void KeyValueStore::set(const std::string& key, const std::string& value) {
  check_key(key);
  check_value(key, value);
  check_room(key, value.size());
  put(key, value);
}

std::optional<std::string> KeyValueStore::get(const std::string& key) const {
  check_key(key);
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::int64_t KeyValueStore::add(const std::string& key, std::int64_t delta) {
  check_key(key);
  check_room(key, 20);  // an int64's digits
  std::int64_t value = 0;
  if (auto it = values_.find(key); it != values_.end()) {
    const char *begin = it->second.data(), *end = begin + it->second.size();
    auto [stop, ec] = std::from_chars(begin, end, value);
    if (ec != std::errc() || stop != end || begin == end) {
      throw refusal(RpcCode::kInvalidArgument, "cannot add to key ", quote(key), ": its value ",
                    quote(it->second), " is not a decimal int64");
    }
  }
  std::int64_t sum = 0;
  if (__builtin_add_overflow(value, delta, &sum)) {
    throw refusal(RpcCode::kInvalidArgument, "adding ", delta, " to key ", quote(key), " (value ",
                  value, ") overflows int64");
  }
  put(key, std::to_string(sum));
  return sum;
}

CompareSetOutcome KeyValueStore::compare_set(const std::string& key, const std::string& expected,
                                             const std::string& desired) {
  check_key(key);
  check_value(key, desired);
  auto it = values_.find(key);
  const bool missing = it == values_.end();
  if (missing ? !expected.empty() : it->second != expected) {
    return CompareSetOutcome{false, missing ? "" : it->second};
  }
  check_room(key, desired.size());
  put(key, desired);
  return CompareSetOutcome{true, desired};
}

bool KeyValueStore::check(const std::vector<std::string>& keys) const {
  bool all = true;
  for (const std::string& key : keys) {
    check_key(key);
    all = all && values_.contains(key);
  }
  return all;
}

bool KeyValueStore::remove(const std::string& key) {
  check_key(key);
  auto it = values_.find(key);
  if (it == values_.end()) return false;
  bytes_ -= it->first.size() + it->second.size();
  values_.erase(it);
  ++changes_;
  return true;
}

std::vector<std::string> KeyValueStore::keys() const {
  std::vector<std::string> keys;
  keys.reserve(values_.size());
  for (const auto& [key, value] : values_) keys.push_back(key);
  return keys;
}

void KeyValueStore::clear() {
  values_.clear();
  bytes_ = 0;
  ++changes_;
}

std::string KeyValueStore::broken_invariant() const {
  std::size_t bytes = 0;
  for (const auto& [key, value] : values_) bytes += key.size() + value.size();
  if (bytes != bytes_)
    return cat("store byte count ", bytes_, " but the keys and values hold ", bytes);
  if (values_.size() > limits_.max_keys)
    return cat("store holds ", values_.size(), " keys, over max_keys");
  if (bytes_ > limits_.max_store_bytes)
    return cat("store holds ", bytes_, " bytes, over the limit");
  return "";
}

}  // namespace ddp::launcher
