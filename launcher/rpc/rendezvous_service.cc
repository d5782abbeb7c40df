#include "rpc/rendezvous_service.h"

#include <algorithm>

#include "ddp/common/error.h"
#include "ddp/common/launcher_log.h"
#include "rpc/service_calls.h"
#include "rpc/status_proto.h"

namespace ddp::launcher {

using namespace service;

namespace {

using namespace std::chrono_literals;
// How often the timer looks even when nothing is due (bounds the cost of a
// missed notification; cancellations arrive through OnCancel).
constexpr auto kIdleTick = 200ms;

}  // namespace

class RendezvousService::WaitReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit WaitReactor(RendezvousService* service) : service_(service) {}
  void OnCancel() override { service_->on_cancel(this); }
  void OnDone() override { delete this; }

 private:
  RendezvousService* service_;
};

RendezvousService::RendezvousService(RendezvousConfig config)
    : state_(std::move(config)), started_(now()) {
  state_.on_node_lost([](const std::string& what) { launcher_log().warn("{}", what); });
  timer_ = std::thread([this] { timer_loop(); });
}

RendezvousService::~RendezvousService() { stop(); }

void RendezvousService::stop() {
  Finished finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    for (auto& w : waiters_) {
      w.cancel();
      finished.emplace_back(w.reactor, grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                                    "rendezvous server shutting down"));
    }
    waiters_.clear();
    by_topic_.clear();
    by_reactor_.clear();
  }
  timer_cv_.notify_all();
  for (auto& [reactor, status] : finished) reactor->Finish(status);
  if (timer_.joinable()) timer_.join();
}

RendezvousState::Phase RendezvousService::phase() {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.phase();
}

std::size_t RendezvousService::pending_waits() {
  std::lock_guard<std::mutex> lock(mu_);
  return waiters_.size();
}

void RendezvousService::on_round_formed(std::function<void(std::int64_t round)> observer) {
  std::lock_guard<std::mutex> lock(mu_);
  state_.on_round_formed(std::move(observer));
}

bool RendezvousService::outcome_delivered() {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.outcome_delivered();
}

std::string RendezvousService::broken_invariant() {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.broken_invariant();
}

grpc::ServerUnaryReactor* RendezvousService::answer(grpc::CallbackServerContext* ctx,
                                                    const grpc::Status& status) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::wait_for(grpc::CallbackServerContext* /*ctx*/,
                                                      std::unique_lock<std::mutex>& lock, Poll poll,
                                                      std::function<void()> cancel,
                                                      std::optional<TimePoint> deadline,
                                                      Topics topics) {
  auto* reactor = new WaitReactor(this);
  if (stopping_) {
    cancel();
    lock.unlock();
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "rendezvous server shutting down"));
    return reactor;
  }
  if (at_wait_limit()) {
    if (auto status = poll(now())) {  // answered at once: no room needed
      wake(lock, topics);
      reactor->Finish(*status);
      return reactor;
    }
    cancel();
    lock.unlock();
    reactor->Finish(
        grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                     "the rendezvous server holds " + std::to_string(waiters_.size()) +
                         " waiting requests, its limit (--rdzv_conf max_pending_waits)"));
    return reactor;
  }
  if (auto status = poll(now())) {
    wake(lock, topics);
    reactor->Finish(*status);
    return reactor;
  }
  // Still pending, so this request decided no one else's answer either: an
  // arrival that does not complete its barrier, a join that does not close
  // the round. Only time can, and the timer sees to that.
  std::sort(topics.begin(), topics.end());
  topics.erase(std::unique(topics.begin(), topics.end()), topics.end());
  auto it = waiters_.insert(
      waiters_.end(), {reactor, std::move(poll), std::move(cancel), deadline, std::move(topics)});
  for (const auto& topic : it->topics) by_topic_.emplace(topic, it);
  by_reactor_.emplace(reactor, it);
  TimePoint due = deadline.value_or(TimePoint::max());
  if (auto d = state_.next_deadline()) due = std::min(due, *d);
  const bool earlier = due < timer_wake_;
  lock.unlock();
  if (earlier) timer_cv_.notify_all();
  return reactor;
}

void RendezvousService::erase_waiter(WaiterList::iterator it) {
  for (const auto& topic : it->topics) {
    auto [first, last] = by_topic_.equal_range(topic);
    for (auto t = first; t != last; ++t) {
      if (t->second == it) {
        by_topic_.erase(t);
        break;
      }
    }
  }
  by_reactor_.erase(it->reactor);
  waiters_.erase(it);
}

void RendezvousService::poll_waiters_locked(TimePoint t, Finished& finished) {
  state_.tick(t);
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    auto next = std::next(it);
    if (auto status = it->poll(t)) {
      finished.emplace_back(it->reactor, *status);
      erase_waiter(it);
    }
    it = next;
  }
}

void RendezvousService::wake(std::unique_lock<std::mutex>& lock, const Topics& topics) {
  Finished finished;
  const TimePoint t = now();
  std::vector<WaiterList::iterator> candidates;
  for (const auto& topic : topics) {
    candidates.clear();
    auto [first, last] = by_topic_.equal_range(topic);
    for (auto w = first; w != last; ++w) candidates.push_back(w->second);
    for (auto w : candidates) {  // a waiter is listed once per topic
      if (auto status = w->poll(t)) {
        finished.emplace_back(w->reactor, *status);
        erase_waiter(w);
      }
    }
  }
  lock.unlock();
  for (auto& [reactor, status] : finished) reactor->Finish(status);
}

void RendezvousService::on_cancel(WaitReactor* reactor) {
  std::unique_lock<std::mutex> lock(mu_);
  auto found = by_reactor_.find(reactor);
  if (found == by_reactor_.end()) return;  // already answered
  // Withdrawing a join or an arrival completes nothing for the others, so no
  // one else needs a poll.
  found->second->cancel();
  erase_waiter(found->second);
  lock.unlock();
  reactor->Finish(grpc::Status::CANCELLED);
}

void RendezvousService::timer_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  TimePoint sweep = now() + kIdleTick;  // polls everyone at least this often
  while (!stopping_) {
    TimePoint wake = sweep;
    if (auto d = state_.next_deadline()) wake = std::min(wake, *d);
    for (const auto& w : waiters_) {
      if (w.deadline) wake = std::min(wake, *w.deadline);
    }
    timer_wake_ = wake;
    timer_cv_.wait_until(lock, wake);
    if (stopping_) break;
    const TimePoint t = now();
    if (t < wake) continue;  // notified: something may be due earlier
    sweep = t + kIdleTick;
    Finished finished;
    poll_waiters_locked(t, finished);
    if (!finished.empty()) {
      lock.unlock();
      for (auto& [reactor, status] : finished) reactor->Finish(status);
      lock.lock();
    }
  }
}

// --- membership ------------------------------------------------------------------

grpc::ServerUnaryReactor* RendezvousService::Join(grpc::CallbackServerContext* ctx,
                                                  const v1::JoinRequest* req,
                                                  v1::JoinResponse* resp) {
  std::unique_lock<std::mutex> lock(mu_);
  NodeInfo args;
  args.node_rank = req->node_rank();
  args.local_world_size = req->local_world_size();
  args.hostname = req->hostname();
  args.address = req->address();
  args.master_port = req->master_port();
  const std::uint64_t before = state_.version();
  const bool was_running = state_.phase() == RendezvousState::Phase::kRunning;
  JoinTicket t;
  grpc::Status joined = status_of([&] { t = state_.join(auth_of(req->auth()), args, now()); });
  if (!joined.ok()) {
    // A refused join may have discarded the forming round: its joiners hear now.
    if (state_.version() != before) {
      wake(lock, {kJoinTopic});
    } else {
      lock.unlock();
    }
    return answer(ctx, joined);
  }
  if (was_running && state_.phase() != RendezvousState::Phase::kRunning) {
    // The join ended the running round (a relaunch, a scale-up): its nodes' held heartbeats hear
    // now.
    wake(lock, {kJoinTopic});
    lock.lock();
  }
  Poll poll = [this, t, resp](TimePoint at) -> std::optional<grpc::Status> {
    std::optional<RoundAssignment> assigned;
    grpc::Status status = status_of([&] { assigned = state_.join_status(t, at); });
    if (!status.ok()) return status;
    if (!assigned) return std::nullopt;
    const RoundAssignment& j = *assigned;
    resp->set_round(j.round);
    resp->set_group_rank(j.group_rank);
    resp->set_group_world_size(j.group_world_size);
    resp->set_world_size(j.world_size);
    resp->set_global_rank_offset(j.global_rank_offset);
    resp->set_master_addr(j.master_addr);
    resp->set_master_port(j.master_port);
    resp->set_restart_count(j.restart_count);
    resp->set_reason(j.reason);
    resp->set_member(j.member);
    resp->set_joined_running(j.joined_running);
    return grpc::Status::OK;
  };
  return wait_for(ctx, lock, std::move(poll), [this, t] { state_.cancel(t); }, std::nullopt,
                  {kJoinTopic});
}

grpc::ServerUnaryReactor* RendezvousService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                       const v1::HeartbeatRequest* req,
                                                       v1::HeartbeatResponse* resp) {
  std::unique_lock<std::mutex> lock(mu_);
  RoundStatus reply;
  grpc::Status status = status_of([&] {
    reply = state_.heartbeat(auth_of(req->auth()), req->round(), req->group_rank(), now(),
                             req->heard_end(), req->member());
  });
  if (status.ok() && req->has_node_state()) record_report_locked(req->node_state(), now());
  auto fill = [resp](const RoundStatus& reply) {
    resp->set_round_ended(reply.round_ended);
    resp->set_reason(reply.reason);
    resp->set_can_restart(reply.can_restart);
    resp->set_succeeded(reply.succeeded);
  };
  // At the waiting-requests limit a heartbeat is answered at once, never refused.
  if (!status.ok() || reply.round_ended || req->hold_ms() == 0 || at_wait_limit()) {
    if (status.ok()) fill(reply);
    lock.unlock();  // a heartbeat only records liveness: no waiter depends on it
    return answer(ctx, status);
  }
  // Held until the round ends (a membership change) or the hold passes.
  const auto until = now() + std::min<std::chrono::milliseconds>(
                                 std::chrono::milliseconds(req->hold_ms()), kMaxHeartbeatHold);
  Poll poll = [this, fill, until, round = req->round(), rank = req->group_rank(),
               member = req->member()](TimePoint at) -> std::optional<grpc::Status> {
    if (auto end = state_.round_end(round, rank, at, member)) {
      fill(*end);
      return grpc::Status::OK;
    }
    if (at >= until) return grpc::Status::OK;  // still running
    return std::nullopt;
  };
  return wait_for(ctx, lock, std::move(poll), [] {}, until, {kJoinTopic});
}

grpc::ServerUnaryReactor* RendezvousService::ReportFailure(grpc::CallbackServerContext* ctx,
                                                           const v1::ReportFailureRequest* req,
                                                           v1::ReportFailureResponse* resp) {
  std::unique_lock<std::mutex> lock(mu_);
  grpc::Status status = status_of([&] {
    resp->set_can_restart(state_.report_failure(auth_of(req->auth()), req->round(),
                                                req->group_rank(), req->report(), req->exit_code(),
                                                now(), req->member()));
  });
  wake(lock, {kJoinTopic});
  return answer(ctx, status);
}

grpc::ServerUnaryReactor* RendezvousService::Leave(grpc::CallbackServerContext* ctx,
                                                   const v1::LeaveRequest* req,
                                                   v1::LeaveResponse*) {
  std::unique_lock<std::mutex> lock(mu_);
  grpc::Status status = status_of([&] {
    state_.leave(auth_of(req->auth()), req->round(), req->group_rank(), req->exit_code(), now(),
                 req->member());
  });
  wake(lock, {kJoinTopic});
  return answer(ctx, status);
}

void RendezvousService::publish_local(const v1::NodeState& state) {
  std::lock_guard<std::mutex> lock(mu_);
  record_report_locked(state, now());
}

void RendezvousService::judge_node_stragglers(std::optional<StragglerRule> rule) {
  std::lock_guard<std::mutex> lock(mu_);
  node_stragglers_.reset();
  if (rule) node_stragglers_.emplace(*rule);
}

void RendezvousService::record_report_locked(const v1::NodeState& state, TimePoint at) {
  reported_[state.node_rank()] = {state, at};
  if (!node_stragglers_) return;
  for (const auto& change : node_stragglers_->observe(at, from_proto(state))) {
    if (change.named) {
      launcher_log().warn("straggler: {}", change.evidence);
    } else {
      launcher_log().info("straggler recovered: {}", change.evidence);
    }
    // Bounded: a host that never takes them (ddprun rendezvous) keeps the latest.
    if (node_straggler_changes_.size() >= 256) {
      node_straggler_changes_.erase(node_straggler_changes_.begin());
    }
    node_straggler_changes_.push_back(change);
  }
}

std::vector<NodeStragglerChange> RendezvousService::take_node_straggler_changes() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(node_straggler_changes_, {});
}

std::vector<NodeStragglerScore> RendezvousService::node_straggler_scores() {
  std::lock_guard<std::mutex> lock(mu_);
  return node_stragglers_ ? node_stragglers_->scores() : std::vector<NodeStragglerScore>{};
}

grpc::ServerUnaryReactor* RendezvousService::Status(grpc::CallbackServerContext* ctx,
                                                    const v1::StatusRequest* req,
                                                    v1::StatusResponse* resp) {
  std::unique_lock<std::mutex> lock(mu_);
  // The run id may be left out: the token alone says who may look.
  Auth auth = auth_of(req->auth());
  if (auth.run_id.empty()) auth.run_id = state_.config().run_id;
  grpc::Status status = status_of([&] { state_.check_auth(auth); });
  if (status.ok()) {
    const TimePoint at = now();
    const std::int64_t round = state_.current_round();
    resp->set_run_id(state_.config().run_id);
    resp->set_round(round);
    resp->set_server_age_s(std::chrono::duration<double>(at - started_).count());
    resp->set_restarts_used(state_.restarts_used());
    for (const auto& [rank, reported] : reported_) {
      // Nodes of an earlier round (a smaller job after a scale-down) are not shown.
      if (round > 0 && reported.state.round() != round) continue;
      v1::NodeStatus* node = resp->add_nodes();
      *node->mutable_state() = reported.state;
      node->set_heartbeat_age_s(std::chrono::duration<double>(at - reported.at).count());
      if (node_stragglers_) {
        node->set_straggler_score(node_stragglers_->score(rank));
        node->set_straggler(node_stragglers_->named(rank));
      }
    }
  }
  lock.unlock();
  return answer(ctx, status);
}

}  // namespace ddp::launcher
