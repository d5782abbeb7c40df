#pragma once
// ControlPlane: how the agent agrees on rounds with the other nodes. Two
// implementations: LocalControlPlane (a single node; no RPC, restarts counted
// here) and the gRPC one in the rpc plugin (multi-node; node 0 also hosts the
// server, restarts counted by the server for the whole job). Errors are
// ddp::Error (or RpcError) naming the endpoint and what failed.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/common/rendezvous_types.h"
#include "observe/job_status.h"
#include "observe/node_straggler_detector.h"

namespace ddp::launcher {

// Liveness of one round: heartbeats on a thread of their own.
class RoundWatch {
 public:
  virtual ~RoundWatch() = default;
  virtual int event_fd() const = 0;  // readable once ended() or lost() says something
  virtual std::optional<RoundStatus>
  ended() = 0;                     // the round ended (elsewhere, or the job succeeded)
  virtual std::string lost() = 0;  // why the server is considered gone
  // Seconds since the server last answered a heartbeat (-1: unknown).
  virtual double heartbeat_age_s() const { return -1; }
};

class ControlPlane {
 public:
  virtual ~ControlPlane() = default;
  // The rendezvous endpoint workers get as DDP_RDZV_ENDPOINT.
  virtual std::string worker_endpoint() const = 0;
  // Why the workers have no rendezvous server at worker_endpoint() (empty
  // when they have one): they then get it as DDP_RDZV_UNAVAILABLE instead.
  virtual std::string workers_server_missing() const { return {}; }
  // Blocks until this node has its place in the next round; `wait` lets a
  // signal end the wait (JoinInterrupted, the node withdrawn).
  virtual RoundAssignment join(const NodeInfo& node, std::chrono::milliseconds timeout,
                               const JoinWait& wait) = 0;
  // A local worker failed; returns whether another round will be formed.
  virtual bool report_failure(const RoundAssignment& round, const std::string& report,
                              int exit_code) = 0;
  // --on_failure=heal: restarts of the job's budget (--max_restarts) still
  // left, and spending one on relaunching a single worker; spend_restart()
  // returns the restarts spent so far, this one included (0: none was left).
  // Only a single node keeps the budget itself: several nodes' budget is the
  // server's, so there none is left for relaunches.
  virtual int restarts_left() const { return 0; }
  virtual int spend_restart() { return 0; }
  // --on_failure=heal: this node's worker of launch rank `rank` (pid `pid`)
  // exited, for the other nodes' ranks, which cannot look its pid up
  // (exited_rank_key). Best effort; a single node needs none.
  virtual void note_exited(const RoundAssignment& round, int rank, long pid) {
    (void)round, (void)rank, (void)pid;
  }
  // Every local worker succeeded.
  virtual void leave(const RoundAssignment& round, int exit_code) = 0;
  // Heartbeats for a round (nullptr when the node is alone and needs none).
  virtual std::unique_ptr<RoundWatch> watch(const RoundAssignment& round) = 0;
  // The job's outcome is decided here (it succeeded, a round failed for good,
  // or the server refused a join): how long a host keeps answering so that
  // the other nodes' next heartbeat or join learns it (the agent waits,
  // answering signals).
  virtual std::chrono::milliseconds linger_time() const { return {}; }
  // Whether every node of the last round has heard how it ended: a host may
  // then stop lingering early.
  virtual bool outcome_delivered() const { return true; }
  // What this node's workers are doing now (ddprun status): kept for the
  // rendezvous server (sent with the next heartbeat, or handed to a
  // single node's server). Never blocks.
  virtual void publish(const NodeStatus& node) { (void)node; }
  // Where this node hosts the rendezvous: the verdicts on other nodes as
  // stragglers that changed since the last call, and every node's standing
  // (observe/node_straggler_detector.h). Elsewhere none.
  virtual std::vector<NodeStragglerChange> take_node_straggler_changes() { return {}; }
  virtual std::vector<NodeStragglerScore> node_straggler_scores() const { return {}; }
};

}  // namespace ddp::launcher
