#pragma once
// RendezvousClient: the one client of the ddp.v1.Rendezvous service, used by
// node agents (membership, heartbeats) and by workers (store, barriers).
// Thread-safe: one instance may be shared by threads. Every call has a
// deadline; a failed call throws RpcError whose message names the endpoint,
// the operation and the key or barrier involved, plus the server's reason.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/common/rendezvous_types.h"

namespace ddp {

struct TlsFiles {
  std::string cert;  // PEM certificate chain (client cert for mutual TLS; optional)
  std::string key;   // PEM private key for `cert`
  std::string ca;    // PEM roots to verify the server with
  bool enabled() const { return !ca.empty() || !cert.empty(); }
};

// Lets one thread cut short another's call in flight (the call then throws
// RpcError kCancelled). Thread-safe; once cancelled, calls that start later
// are cancelled at once.
class CallCanceller {
 public:
  void cancel();

 private:
  friend class RendezvousClient;
  // Registers a call's context (a grpc::ClientContext); false once cancelled.
  bool attach(void* context);
  void detach();
  std::mutex mu_;
  void* context_ = nullptr;
  bool cancelled_ = false;
};

class RendezvousClient {
 public:
  // `endpoint` is HOST:PORT ("[::1]:29400" for IPv6). Connecting is lazy,
  // and every call except heartbeat() waits for the server to become
  // reachable until its deadline (a single node's server may still be
  // starting when its workers call): an unreachable server, or a TLS
  // mismatch, ends as RpcError kDeadlineExceeded after the call's deadline
  // (30 s for store calls, the operation's timeout + 2 s for waits, joins and
  // barriers). heartbeat() fails at once, since silence is what it detects.
  RendezvousClient(const std::string& endpoint, std::string run_id, std::string token,
                   const TlsFiles& tls = {});
  ~RendezvousClient();
  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

  const std::string& endpoint() const { return endpoint_; }

  // --- membership (node agents) -------------------------------------------
  // Blocks until the round closes; retries an unreachable server with
  // backoff until `timeout`. The calls below then speak as the node it
  // admitted (they carry its RoundAssignment::member).
  // `wait` lets a signal cut the wait short (JoinInterrupted).
  RoundAssignment join(const NodeInfo& node, std::chrono::milliseconds timeout,
                       const JoinWait& wait = {});
  // `hold` > 0 asks the server to hold the answer until the round ends or
  // `hold` passes (a server that does not hold answers at once); the call
  // fails after hold + `timeout`. `canceller` may cut it short.
  // `node_state`: a serialized ddp.v1.NodeState sent along (ddprun status), or empty.
  RoundStatus heartbeat(std::int64_t round, int group_rank, std::chrono::milliseconds timeout,
                        std::chrono::milliseconds hold = {}, CallCanceller* canceller = nullptr,
                        const std::string& node_state = {});
  // Tells the server this node has heard that its round ended (so the host
  // may stop serving once every node has). Best effort: errors are ignored.
  void acknowledge_end(std::int64_t round, int group_rank, std::chrono::milliseconds timeout);
  // `deadline` bounds the call (a node stopping must not wait long for an
  // unreachable server).
  bool report_failure(std::int64_t round, int group_rank, const std::string& report, int exit_code,
                      std::chrono::milliseconds deadline = std::chrono::seconds(30));
  void leave(std::int64_t round, int group_rank, int exit_code);

  // --- store ------------------------------------------------------------------
  void set(const std::string& key, const std::string& value);
  std::optional<std::string> try_get(const std::string& key);
  // Waits up to `timeout` for the key to exist (RpcError kDeadlineExceeded naming it otherwise).
  std::string get(const std::string& key, std::chrono::milliseconds timeout);
  std::int64_t add(const std::string& key, std::int64_t delta);
  CompareSetOutcome compare_set(const std::string& key, const std::string& expected,
                                const std::string& desired);
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  bool remove(const std::string& key);
  std::int64_t num_keys();

  // --- barrier ------------------------------------------------------------------
  // One round trip. On timeout the RpcError lists the ranks that never arrived.
  void barrier(const std::string& name, int rank, int world_size, std::chrono::milliseconds timeout,
               const std::string& host = "");

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string endpoint_;
};

}  // namespace ddp
