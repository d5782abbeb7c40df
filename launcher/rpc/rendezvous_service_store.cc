// RendezvousService's key-value store and barrier handlers (torch's
// TCPStore operations and ddprun's named barriers).

#include "ddp/common/error.h"
#include "rpc/rendezvous_service.h"
#include "rpc/service_calls.h"

namespace ddp::launcher {

using namespace service;

grpc::ServerUnaryReactor* RendezvousService::Set(grpc::CallbackServerContext* ctx,
                                                 const v1::SetRequest* req, v1::SetResponse*) {
  std::unique_lock<std::mutex> lock(mu_);
  grpc::Status status =
      status_of([&] { state_.store(auth_of(req->auth())).set(req->key(), req->value()); });
  wake(lock, {key_topic(req->key())});
  return answer(ctx, status);
}

grpc::ServerUnaryReactor* RendezvousService::Get(grpc::CallbackServerContext* ctx,
                                                 const v1::GetRequest* req, v1::GetResponse* resp) {
  std::unique_lock<std::mutex> lock(mu_);
  Auth auth = auth_of(req->auth());
  std::optional<std::string> value;
  grpc::Status status = status_of([&] { value = state_.store(auth).get(req->key()); });
  if (!status.ok() || value || !req->wait()) {
    if (value) {
      resp->set_found(true);
      resp->set_value(*value);
    }
    lock.unlock();
    return answer(ctx, status);
  }
  TimePoint deadline = deadline_after(req->timeout_ms());
  std::string key = req->key();
  std::int64_t timeout_ms = req->timeout_ms();
  Poll poll = [this, auth, key, deadline, timeout_ms,
               resp](TimePoint at) -> std::optional<grpc::Status> {
    std::optional<std::string> value;
    grpc::Status status = status_of([&] { value = state_.store(auth).get(key); });
    if (!status.ok()) return status;
    if (value) {
      resp->set_found(true);
      resp->set_value(*value);
      return status;
    }
    if (at >= deadline) {
      return error_status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          "key '" + key + "' was not set within " + seconds_text(timeout_ms));
    }
    return std::nullopt;
  };
  return wait_for(ctx, lock, std::move(poll), [] {}, deadline, {key_topic(key)});
}

grpc::ServerUnaryReactor* RendezvousService::Add(grpc::CallbackServerContext* ctx,
                                                 const v1::AddRequest* req, v1::AddResponse* resp) {
  std::unique_lock<std::mutex> lock(mu_);
  grpc::Status status = status_of(
      [&] { resp->set_value(state_.store(auth_of(req->auth())).add(req->key(), req->delta())); });
  wake(lock, {key_topic(req->key())});
  return answer(ctx, status);
}

grpc::ServerUnaryReactor* RendezvousService::CompareSet(grpc::CallbackServerContext* ctx,
                                                        const v1::CompareSetRequest* req,
                                                        v1::CompareSetResponse* resp) {
  std::unique_lock<std::mutex> lock(mu_);
  grpc::Status status = status_of([&] {
    CompareSetOutcome r =
        state_.store(auth_of(req->auth())).compare_set(req->key(), req->expected(), req->desired());
    resp->set_swapped(r.swapped);
    resp->set_current(r.current);
  });
  wake(lock, {key_topic(req->key())});
  return answer(ctx, status);
}

grpc::ServerUnaryReactor* RendezvousService::Wait(grpc::CallbackServerContext* ctx,
                                                  const v1::WaitRequest* req, v1::WaitResponse*) {
  std::unique_lock<std::mutex> lock(mu_);
  Auth auth = auth_of(req->auth());
  std::vector<std::string> keys(req->keys().begin(), req->keys().end());
  Topics topics;
  for (const auto& k : keys) topics.push_back(key_topic(k));
  TimePoint deadline = deadline_after(req->timeout_ms());
  std::int64_t timeout_ms = req->timeout_ms();
  Poll poll = [this, auth, keys, deadline,
               timeout_ms](TimePoint at) -> std::optional<grpc::Status> {
    bool all_set = false;
    grpc::Status status = status_of([&] { all_set = state_.store(auth).check(keys); });
    if (!status.ok() || all_set) return status;
    if (at < deadline) return std::nullopt;
    std::string missing;
    for (const auto& k : keys) {  // check() has accepted every key
      if (!state_.store(auth).get(k)) missing += (missing.empty() ? "'" : ", '") + k + "'";
    }
    return error_status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        "keys never set within " + seconds_text(timeout_ms) + ": " + missing);
  };
  return wait_for(
      ctx, lock, std::move(poll), [] {}, deadline, std::move(topics));
}

grpc::ServerUnaryReactor* RendezvousService::Delete(grpc::CallbackServerContext* ctx,
                                                    const v1::DeleteRequest* req,
                                                    v1::DeleteResponse* resp) {
  std::unique_lock<std::mutex> lock(mu_);
  grpc::Status status =
      status_of([&] { resp->set_deleted(state_.store(auth_of(req->auth())).remove(req->key())); });
  lock.unlock();  // a deletion completes no wait
  return answer(ctx, status);
}

grpc::ServerUnaryReactor* RendezvousService::NumKeys(grpc::CallbackServerContext* ctx,
                                                     const v1::NumKeysRequest* req,
                                                     v1::NumKeysResponse* resp) {
  std::unique_lock<std::mutex> lock(mu_);
  grpc::Status status =
      status_of([&] { resp->set_count(state_.store(auth_of(req->auth())).size()); });
  lock.unlock();
  return answer(ctx, status);
}

grpc::ServerUnaryReactor* RendezvousService::Barrier(grpc::CallbackServerContext* ctx,
                                                     const v1::BarrierRequest* req,
                                                     v1::BarrierResponse*) {
  std::unique_lock<std::mutex> lock(mu_);
  TimePoint deadline = deadline_after(req->timeout_ms());
  Auth auth = auth_of(req->auth());
  BarrierTicket t;
  grpc::Status arrived = status_of([&] {
    const TimePoint at = now();
    t = state_.barriers(auth, at).arrive(req->name(), req->rank(), req->world_size(), req->host(),
                                         deadline, at);
  });
  if (!arrived.ok()) {
    lock.unlock();
    return answer(ctx, arrived);
  }
  // Polled with the credentials it arrived with (they passed then, so they pass).
  Poll poll = [this, auth, t](TimePoint at) -> std::optional<grpc::Status> {
    bool passed = false;
    grpc::Status status = status_of([&] { passed = state_.barriers(auth, at).passed(t); });
    if (!status.ok() || passed) return status;
    return std::nullopt;
  };
  return wait_for(ctx, lock, std::move(poll), [this, t] { state_.cancel(t); }, deadline,
                  {barrier_topic(req->name())});
}

}  // namespace ddp::launcher
