#pragma once
// TorchStoreState: what torch's TCPStore server does with a query, with no
// I/O: keys in a KeyValueStore bounded by the rendezvous's limits (max_keys,
// max_store_bytes, max_key_bytes, max_value_bytes, all --rdzv_conf keys),
// queues bounded by the same numbers again, and the waits of WAIT and
// BARRIER. Clients are numbers; each answer says whom it goes to, so a SET
// can release the clients that wait for its key.
//
// Semantics are torch's (its libuv backend, the default in 2.x):
//   - GET and MULTI_GET of a missing key answer an empty value (clients WAIT
//     first); COMPARE_SET of a missing key with a non-empty expected value
//     answers the expected value and sets nothing;
//   - WAIT answers STOP_WAITING once every key exists (a non-empty queue
//     counts); a client's new WAIT replaces the one it still has, and
//     CANCEL_WAIT ends it, answered WAIT_CANCELED;
//   - BARRIER(key, n) adds one to the counter at `key` and answers
//     STOP_WAITING to every arrival once the counter reaches n;
//   - QUEUE_POP answers the queue's length before the pop, then the value
//     popped when there was one; QUEUE_PUSH releases one waiting client.
// A query refused for a limit, or an ADD to a value that is not an integer,
// throws ddp::RpcError naming the key and limit (the server closes that
// client's connection, as torch's does on an error); what a MULTI_SET set
// before the refused key stays set.
//
// Not thread-safe: TorchStore calls it under its mutex.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "rendezvous/key_value_store.h"
#include "rendezvous/limits.h"
#include "store/torch_store_protocol.h"

namespace ddp::launcher::torch_store {

using ClientId = std::uint64_t;

struct Outgoing {
  ClientId client;
  std::string bytes;
};

class TorchStoreState {
 public:
  explicit TorchStoreState(const RendezvousLimits& limits) : limits_(limits), store_(limits_) {}

  // Answers `query` from `client`: appends to `out` the bytes for each client
  // that gets some (the client's own answer, and those its query released).
  void execute(ClientId client, const Query& query, std::vector<Outgoing>& out);
  // The client's connection closed: its wait ends.
  void forget(ClientId client);
  // Drops every key, counter and queue (a new round's workers must not see
  // the last round's). Waiting clients go on waiting.
  void clear();

  std::size_t num_keys() const { return static_cast<std::size_t>(store_.size()); }
  std::size_t waiting_clients() const { return waits_.size(); }

 private:
  struct Wait {
    std::size_t left = 0;           // keys that do not exist yet
    std::vector<std::string> keys;  // where the client is listed in waiting_
  };

  void answer(const Query& q, ClientId client, std::string& reply, std::vector<Outgoing>& out);
  void compare_set(const Query& q, std::string& reply, std::vector<Outgoing>& out);
  void wait(const Query& q, ClientId client, std::string& reply);
  void barrier(const Query& q, ClientId client, std::string& reply, std::vector<Outgoing>& out);
  void queue_push(const std::string& key, const std::string& value, std::vector<Outgoing>& out);
  void queue_pop(const std::string& key, std::string& reply);
  void set(const std::string& key, const std::string& value, std::vector<Outgoing>& out);
  bool exists(const std::string& key) const;  // a key, or a non-empty queue
  // Lists `client` as waiting for `keys`, the missing ones counted.
  void add_wait(ClientId client, std::vector<std::string> keys, std::size_t left);
  // A key appeared: each of its waiters with nothing left to wait for is told
  // STOP_WAITING. `one`: only the first such waiter (a queue's push).
  void release(const std::string& key, std::vector<Outgoing>& out, bool one = false);

  const RendezvousLimits limits_;
  KeyValueStore store_;
  std::map<std::string, std::deque<std::string>> queues_;
  std::size_t queue_items_ = 0, queue_bytes_ = 0;
  std::unordered_map<std::string, std::vector<ClientId>>
      waiting_;  // key -> clients, in arrival order
  std::unordered_map<ClientId, Wait> waits_;
};

}  // namespace ddp::launcher::torch_store
