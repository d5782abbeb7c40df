#pragma once
// The key-value store a process group rendezvous through (Gloo exchanges
// addresses on it, NCCL its unique id). Small on purpose, like Gloo's
// rendezvous::Store: easy to implement and to fake. Implementations are
// thread-safe. Errors are ddp::Error naming the key.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ddp {

class RendezvousClient;

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits up to `timeout` for the key; throws ddp::Error naming it on timeout.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Atomic counter (a missing key counts as 0); returns the new value.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  // Waits until every key exists; throws ddp::Error listing the missing ones on timeout.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  virtual bool remove(const std::string& key) = 0;
};

// The store on the job's gRPC rendezvous (shares `client`).
std::shared_ptr<Store> make_grpc_store(std::shared_ptr<RendezvousClient> client);
// An in-process store for ranks that are threads of one process (tests).
std::shared_ptr<Store> make_memory_store();
// Every key goes through `prefix` + "/" (scopes a store by run, round and group).
std::shared_ptr<Store> make_prefix_store(std::shared_ptr<Store> inner, const std::string& prefix);

}  // namespace ddp
