// Store implementations: gRPC (the job's rendezvous), in-memory (threads), prefix.

#include <condition_variable>
#include <map>
#include <mutex>

#include "ddp/common/error.h"
#include "ddp/common/rendezvous_client.h"
#include "ddp/store.h"

namespace ddp {
namespace {

class GrpcStore final : public Store {
 public:
  explicit GrpcStore(std::shared_ptr<RendezvousClient> client) : client_(std::move(client)) {}
  void set(const std::string& key, const std::string& value) override { client_->set(key, value); }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    return client_->get(key, timeout);
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    return client_->add(key, delta);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    client_->wait(keys, timeout);
  }
  bool remove(const std::string& key) override { return client_->remove(key); }

 private:
  std::shared_ptr<RendezvousClient> client_;
};

class MemoryStore final : public Store {
 public:
  void set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      data_[key] = value;
    }
    cv_.notify_all();
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return data_.count(key) > 0; })) {
      throw Error("store: key '" + key + "' was not set within " + std::to_string(timeout.count()) +
                  " ms");
    }
    return data_[key];
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    std::int64_t value;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = data_.find(key);
      value = (it == data_.end() ? 0 : std::stoll(it->second)) + delta;
      data_[key] = std::to_string(value);
    }
    cv_.notify_all();
    return value;
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    auto all = [&] {
      for (const auto& k : keys) {
        if (!data_.count(k)) return false;
      }
      return true;
    };
    if (!cv_.wait_for(lock, timeout, all)) {
      std::string missing;
      for (const auto& k : keys) {
        if (!data_.count(k)) missing += (missing.empty() ? "'" : ", '") + k + "'";
      }
      throw Error("store: keys never set within " + std::to_string(timeout.count()) +
                  " ms: " + missing);
    }
  }
  bool remove(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    return data_.erase(key) > 0;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
};

class PrefixStore final : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> inner, std::string prefix)
      : inner_(std::move(inner)), prefix_(std::move(prefix) + "/") {}
  void set(const std::string& key, const std::string& value) override {
    inner_->set(prefix_ + key, value);
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    return inner_->get(prefix_ + key, timeout);
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    return inner_->add(prefix_ + key, delta);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::vector<std::string> scoped;
    for (const auto& k : keys) scoped.push_back(prefix_ + k);
    inner_->wait(scoped, timeout);
  }
  bool remove(const std::string& key) override { return inner_->remove(prefix_ + key); }

 private:
  std::shared_ptr<Store> inner_;
  std::string prefix_;
};

}  // namespace

std::shared_ptr<Store> make_grpc_store(std::shared_ptr<RendezvousClient> client) {
  return std::make_shared<GrpcStore>(std::move(client));
}
std::shared_ptr<Store> make_memory_store() { return std::make_shared<MemoryStore>(); }
std::shared_ptr<Store> make_prefix_store(std::shared_ptr<Store> inner, const std::string& prefix) {
  return std::make_shared<PrefixStore>(std::move(inner), prefix);
}

}  // namespace ddp
