#include "torch_store.h"

#include <exception>
#include <utility>

#include "ddp/common/error.h"

namespace ddprun_torch {
namespace {

std::string join(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& key : keys) out += (out.empty() ? "" : ", ") + key;
  return out;
}

class TorchStore : public ddp::Store {
 public:
  explicit TorchStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::string& value) override {
    try {
      store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
    } catch (const std::exception& e) {
      throw ddp::Error("store: set '" + key + "' failed: " + e.what());
    }
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    wait({key}, timeout);
    try {
      auto bytes = store_->get(key);
      return std::string(bytes.begin(), bytes.end());
    } catch (const std::exception& e) {
      throw ddp::Error("store: get '" + key + "' failed: " + e.what());
    }
  }

  std::int64_t add(const std::string& key, std::int64_t delta) override {
    try {
      return store_->add(key, delta);
    } catch (const std::exception& e) {
      throw ddp::Error("store: add to '" + key + "' failed: " + e.what());
    }
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    try {
      store_->wait(keys, timeout);
    } catch (const std::exception& e) {
      throw ddp::Error("store: waited " + std::to_string(timeout.count()) + " ms for " +
                       join(keys) + ": " + e.what());
    }
  }

  bool remove(const std::string& key) override {
    try {
      return store_->deleteKey(key);
    } catch (const std::exception& e) {
      throw ddp::Error("store: remove '" + key + "' failed: " + e.what());
    }
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace

std::shared_ptr<ddp::Store> wrap_torch_store(c10::intrusive_ptr<c10d::Store> store) {
  return std::make_shared<TorchStore>(std::move(store));
}

}  // namespace ddprun_torch
