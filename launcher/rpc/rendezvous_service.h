#pragma once
// RendezvousService: the thin gRPC glue around RendezvousState (callback
// API). Non-blocking RPCs answer at once under the state's mutex. Blocking
// ones (Join, Get with wait, Wait, Barrier) become waiters: each is polled
// when a change it depends on happens (its key is written, its barrier or
// round completes) and by a timer thread at the state's next deadline, and
// finished as soon as its answer is known, so a thousand waiting ranks cost
// no threads, and one arrival costs one poll, not one per waiting rank. A client that goes away
// cancels its waiter (its join or barrier arrival is withdrawn).
//
// RendezvousServer owns a grpc::Server with this service plus the standard
// grpc.health.v1.Health service (SERVING while up, NOT_SERVING once shutdown
// begins).

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ddp/v1/rendezvous.grpc.pb.h"
#include "observe/node_straggler_detector.h"
#include "rendezvous/rendezvous_state.h"
#include "rpc/connection_acceptor.h"
#include "store/torch_store.h"

namespace ddp::launcher {

class RendezvousService final : public v1::Rendezvous::CallbackService {
 public:
  explicit RendezvousService(RendezvousConfig config);  // throws ddp::Error for a bad config
  ~RendezvousService() override;

  // Finishes every waiter with UNAVAILABLE and stops the timer thread.
  void stop();
  RendezvousState::Phase phase();
  bool outcome_delivered();        // see RendezvousState::outcome_delivered
  std::string broken_invariant();  // see RendezvousState::broken_invariant (for the fuzzer)
  std::size_t pending_waits();     // requests held now
  // See RendezvousState::on_round_formed (called under the service's mutex).
  void on_round_formed(std::function<void(std::int64_t round)> observer);
  // Stragglers across nodes (observe/node_straggler_detector.h), judged from
  // the nodes' reports: `rule` (straggler_rule of --straggler_window and
  // the heartbeat interval), or nullopt for none (--straggler_window=0).
  // Verdicts are logged here and shown by ddprun status. Default: the
  // default rule.
  void judge_node_stragglers(std::optional<StragglerRule> rule);
  // The node verdicts that changed since the last call (for the host's
  // events and metrics), and every node's standing now.
  std::vector<NodeStragglerChange> take_node_straggler_changes();
  std::vector<NodeStragglerScore> node_straggler_scores();

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext*, const v1::JoinRequest*,
                                 v1::JoinResponse*) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext*, const v1::HeartbeatRequest*,
                                      v1::HeartbeatResponse*) override;
  grpc::ServerUnaryReactor* ReportFailure(grpc::CallbackServerContext*,
                                          const v1::ReportFailureRequest*,
                                          v1::ReportFailureResponse*) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext*, const v1::LeaveRequest*,
                                  v1::LeaveResponse*) override;
  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext*, const v1::SetRequest*,
                                v1::SetResponse*) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext*, const v1::GetRequest*,
                                v1::GetResponse*) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext*, const v1::AddRequest*,
                                v1::AddResponse*) override;
  grpc::ServerUnaryReactor* CompareSet(grpc::CallbackServerContext*, const v1::CompareSetRequest*,
                                       v1::CompareSetResponse*) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext*, const v1::WaitRequest*,
                                 v1::WaitResponse*) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext*, const v1::DeleteRequest*,
                                   v1::DeleteResponse*) override;
  grpc::ServerUnaryReactor* NumKeys(grpc::CallbackServerContext*, const v1::NumKeysRequest*,
                                    v1::NumKeysResponse*) override;
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext*, const v1::BarrierRequest*,
                                    v1::BarrierResponse*) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext*, const v1::StatusRequest*,
                                   v1::StatusResponse*) override;
  // A single node's status, handed over in-process (no heartbeats there).
  void publish_local(const v1::NodeState& state);
  // Records a node's report and judges stragglers with it. Called with mu_ held.
  void record_report_locked(const v1::NodeState& state, TimePoint at);

 private:
  class WaitReactor;
  // Fills the response and returns the final status, or nullopt while pending.
  using Poll = std::function<std::optional<grpc::Status>(TimePoint now)>;
  // What a waiter's answer depends on ("k:" key, "b:" barrier name, "j" the
  // forming round): a change wakes the waiters of the topics it touches.
  using Topics = std::vector<std::string>;
  struct Waiter {
    WaitReactor* reactor;
    Poll poll;
    std::function<void()> cancel;       // withdraws the request from the state
    std::optional<TimePoint> deadline;  // when poll() must be asked again
    Topics topics;                      // sorted, distinct
  };
  using WaiterList = std::list<Waiter>;
  using Finished = std::vector<std::pair<grpc::ServerUnaryReactor*, grpc::Status>>;

  grpc::ServerUnaryReactor* answer(grpc::CallbackServerContext* ctx, const grpc::Status& status);
  // Polls once; if final, wakes the waiters of `topics` (this request may be
  // what they waited for); else registers a waiter. Called with mu_ held via `lock`.
  grpc::ServerUnaryReactor* wait_for(grpc::CallbackServerContext* ctx,
                                     std::unique_lock<std::mutex>& lock, Poll poll,
                                     std::function<void()> cancel,
                                     std::optional<TimePoint> deadline, Topics topics);
  void poll_waiters_locked(TimePoint now, Finished& finished);  // all of them (the timer)
  // Polls the waiters of `topics`, then unlocks and finishes those answered.
  void wake(std::unique_lock<std::mutex>& lock, const Topics& topics);
  void erase_waiter(WaiterList::iterator it);
  // Whether max_pending_waits requests are held already. Called with mu_ held.
  bool at_wait_limit() const { return waiters_.size() >= state_.config().limits.max_pending_waits; }
  void on_cancel(WaitReactor* reactor);
  void timer_loop();

  std::mutex mu_;
  RendezvousState state_;
  struct Reported {
    v1::NodeState state;
    TimePoint at;
  };
  std::map<int, Reported> reported_;  // by group rank: the last status each node sent
  std::optional<NodeStragglerDetector> node_stragglers_{std::in_place};
  std::vector<NodeStragglerChange> node_straggler_changes_;  // not yet taken
  TimePoint started_;
  WaiterList waiters_;
  std::multimap<std::string, WaiterList::iterator> by_topic_;
  std::unordered_map<WaitReactor*, WaiterList::iterator> by_reactor_;
  bool stopping_ = false;
  TimePoint timer_wake_ = TimePoint::max();  // when the timer will look next
  std::condition_variable timer_cv_;
  std::thread timer_;
};

struct ServerOptions {
  std::string host = "127.0.0.1";  // "::" or "0.0.0.0" for every interface
  int port = 0;                    // 0: pick a free port
  std::string tls_cert, tls_key;   // PEM files: serve TLS (clients are authenticated by the token)
  int max_message_bytes = 8 << 20;
  // A connection that has not begun HTTP/2 (plaintext) or completed the TLS
  // handshake by then is closed.
  int handshake_timeout_ms = 10000;
  // Plaintext only: also serve torch.distributed's TCPStore protocol on the
  // port (torch_store.h), the program's store under
  // TORCHELASTIC_USE_AGENT_STORE=True, emptied whenever a round forms.
  bool torch_store = false;
};

class RendezvousServer {
 public:
  // Starts serving. Throws ddp::Error naming the address when the port is
  // in use or the address is not local, or when TLS files cannot be read.
  RendezvousServer(const RendezvousConfig& config, const ServerOptions& options);
  ~RendezvousServer();  // shutdown(): NOT_SERVING, waiters released, server stopped

  int port() const { return port_; }
  RendezvousService& service() { return *service_; }
  TorchStore* torch_store() {
    return torch_store_.get();
  }  // null unless ServerOptions::torch_store
  void shutdown();
  // Blocks until shutdown() is called from another thread or a signal handler thread.
  void wait();

 private:
  std::unique_ptr<RendezvousService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<TorchStore> torch_store_;
  std::unique_ptr<ConnectionAcceptor> acceptor_;  // plaintext only; TLS uses gRPC's
  int port_ = 0;
  std::once_flag shutdown_once_;
};

}  // namespace ddp::launcher
