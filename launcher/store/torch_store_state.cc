#include "store/torch_store_state.h"

#include <algorithm>

#include "rendezvous/messages.h"

namespace ddp::launcher::torch_store {
namespace {

std::string stop_waiting() {
  std::string bytes;
  put_u8(bytes, kStopWaiting);
  return bytes;
}

}  // namespace

void TorchStoreState::execute(ClientId client, const Query& query, std::vector<Outgoing>& out) {
  std::string reply;
  answer(query, client, reply, out);
  if (!reply.empty()) out.push_back({client, std::move(reply)});
}

void TorchStoreState::answer(const Query& q, ClientId client, std::string& reply,
                             std::vector<Outgoing>& out) {
  const std::string empty;
  const std::string& key = q.keys.empty() ? empty : q.keys.front();
  switch (q.op) {
    case Op::kValidate:
      return;  // the magic was checked by decode
    case Op::kPing:
      return put_u32(reply, q.nonce);
    case Op::kSet:
      return set(key, q.values.at(0), out);
    case Op::kCompareSet:
      return compare_set(q, reply, out);
    case Op::kGet:
      return put_bytes(reply, store_.get(key).value_or(""));
    case Op::kAdd: {
      const std::int64_t value = store_.add(key, q.number);
      release(key, out);
      return put_i64(reply, value);
    }
    case Op::kCheck: {
      const bool all = std::all_of(q.keys.begin(), q.keys.end(),
                                   [&](const std::string& k) { return exists(k); });
      return put_u8(reply, all ? kReady : kNotReady);
    }
    case Op::kWait:
      return wait(q, client, reply);
    case Op::kNumKeys:
      return put_i64(reply, store_.size());
    case Op::kDeleteKey:
      return put_i64(reply, store_.remove(key) ? 1 : 0);
    case Op::kAppend:
      return set(key, store_.get(key).value_or("") + q.values.at(0), out);
    case Op::kMultiGet:
      for (const std::string& k : q.keys) put_bytes(reply, store_.get(k).value_or(""));
      return;
    case Op::kMultiSet:
      for (std::size_t i = 0; i < q.keys.size(); ++i) set(q.keys[i], q.values.at(i), out);
      return;
    case Op::kCancelWait:
      forget(client);
      return put_u8(reply, kWaitCanceled);
    case Op::kQueuePush:
      return queue_push(key, q.values.at(0), out);
    case Op::kQueuePop:
      return queue_pop(key, reply);
    case Op::kQueueLen: {
      auto it = queues_.find(key);
      return put_i64(reply, it == queues_.end() ? 0 : static_cast<std::int64_t>(it->second.size()));
    }
    case Op::kListKeys: {
      const std::vector<std::string> keys = store_.keys();
      put_i64(reply, static_cast<std::int64_t>(keys.size()));
      for (const std::string& k : keys) put_bytes(reply, k);
      return;
    }
    case Op::kBarrier:
      return barrier(q, client, reply, out);
  }
}

void TorchStoreState::set(const std::string& key, const std::string& value,
                          std::vector<Outgoing>& out) {
  store_.set(key, value);
  release(key, out);
}

void TorchStoreState::compare_set(const Query& q, std::string& reply, std::vector<Outgoing>& out) {
  const std::string& key = q.keys.front();
  const std::string& expected = q.values.at(0);
  const std::string& desired = q.values.at(1);
  if (!store_.get(key) && !expected.empty())
    return put_bytes(reply, expected);  // torch's answer: nothing set
  const CompareSetOutcome outcome = store_.compare_set(key, expected, desired);
  release(key, out);
  put_bytes(reply, outcome.current);
}

bool TorchStoreState::exists(const std::string& key) const {
  if (store_.check({key})) return true;
  auto it = queues_.find(key);
  return it != queues_.end() && !it->second.empty();
}

void TorchStoreState::wait(const Query& q, ClientId client, std::string& reply) {
  forget(client);  // a new WAIT replaces the client's last one
  std::vector<std::string> missing;
  for (const std::string& key : q.keys) {
    if (!exists(key) && std::find(missing.begin(), missing.end(), key) == missing.end())
      missing.push_back(key);
  }
  if (missing.empty()) return put_u8(reply, kStopWaiting);
  const std::size_t left = missing.size();
  add_wait(client, std::move(missing), left);
}

void TorchStoreState::barrier(const Query& q, ClientId client, std::string& reply,
                              std::vector<Outgoing>& out) {
  const std::string& key = q.keys.front();
  forget(client);
  const std::int64_t arrived =
      store_.add(key, 1);  // no release: the waiters wait for the last arrival
  if (arrived >= q.number) {
    release(key, out);
    return put_u8(reply, kStopWaiting);
  }
  add_wait(client, {key}, 1);
}

void TorchStoreState::queue_push(const std::string& key, const std::string& value,
                                 std::vector<Outgoing>& out) {
  if (queue_items_ >= limits_.max_keys) {
    throw refusal(RpcCode::kResourceExhausted, "cannot push to queue ", quote(key),
                  ": the queues hold ", queue_items_, " values, limit ", limits_.max_keys,
                  " (--rdzv_conf max_keys)");
  }
  const std::size_t bytes = key.size() + value.size();
  if (queue_bytes_ + bytes > limits_.max_store_bytes) {
    throw refusal(RpcCode::kResourceExhausted, "cannot push ", value.size(), " bytes to queue ",
                  quote(key), ": the queues would hold ", queue_bytes_ + bytes, " bytes, limit ",
                  limits_.max_store_bytes, " (--rdzv_conf max_store_bytes)");
  }
  queues_[key].push_back(value);
  ++queue_items_;
  queue_bytes_ += bytes;
  release(key, out, /*one=*/true);
}

void TorchStoreState::queue_pop(const std::string& key, std::string& reply) {
  auto it = queues_.find(key);
  if (it == queues_.end() || it->second.empty()) return put_i64(reply, 0);
  put_i64(reply, static_cast<std::int64_t>(it->second.size()));
  put_bytes(reply, it->second.front());
  --queue_items_;
  queue_bytes_ -= key.size() + it->second.front().size();
  it->second.pop_front();
  if (it->second.empty()) queues_.erase(it);
}

void TorchStoreState::add_wait(ClientId client, std::vector<std::string> keys, std::size_t left) {
  for (const std::string& key : keys) waiting_[key].push_back(client);
  waits_[client] = Wait{left, std::move(keys)};
}

void TorchStoreState::release(const std::string& key, std::vector<Outgoing>& out, bool one) {
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return;
  std::vector<ClientId>& clients = it->second;
  const std::size_t count = one ? 1 : clients.size();
  for (std::size_t i = 0; i < count; ++i) {
    auto wait = waits_.find(clients[i]);
    if (wait == waits_.end() || --wait->second.left > 0) continue;
    out.push_back({clients[i], stop_waiting()});
    // Released: no longer listed under its other keys either.
    for (const std::string& other : wait->second.keys) {
      if (other == key) continue;
      auto listed = waiting_.find(other);
      if (listed == waiting_.end()) continue;
      std::erase(listed->second, clients[i]);
      if (listed->second.empty()) waiting_.erase(listed);
    }
    waits_.erase(wait);
  }
  clients.erase(clients.begin(), clients.begin() + static_cast<std::ptrdiff_t>(count));
  if (clients.empty()) waiting_.erase(it);
}

void TorchStoreState::forget(ClientId client) {
  auto wait = waits_.find(client);
  if (wait == waits_.end()) return;
  for (const std::string& key : wait->second.keys) {
    auto listed = waiting_.find(key);
    if (listed == waiting_.end()) continue;
    std::erase(listed->second, client);
    if (listed->second.empty()) waiting_.erase(listed);
  }
  waits_.erase(wait);
}

void TorchStoreState::clear() {
  store_.clear();
  queues_.clear();
  queue_items_ = 0;
  queue_bytes_ = 0;
}

}  // namespace ddp::launcher::torch_store
