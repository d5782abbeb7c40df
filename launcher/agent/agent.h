#pragma once
// The node agent: runs this node's worker group through the job's rounds.
// Each round: Join the rendezvous (which assigns the node's group rank and
// global rank offset), spawn every worker with the environment contract,
// supervise them (output, exits, signals, heartbeats), stop the group when a
// worker fails, the round ends elsewhere or a signal arrives (SIGTERM, grace
// period, SIGKILL of each worker's process group), and join the next round
// while the server's job-wide restart budget allows. The supervision loop is
// single-threaded (poll on the workers' pipes, a signalfd and the heartbeat
// monitor's eventfd); heartbeats run on their own thread. After each attempt,
// once its workers are gone, the run's POSIX shared-memory segments left by
// killed workers are removed (see ddp/common/shm_names.h).

#include <signal.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/control_plane.h"
#include "agent/heal_marks.h"
#include "agent/observer.h"
#include "agent/port_reservation.h"
#include "agent/run_files.h"
#include "cli/launch_spec.h"
#include "observe/runtime_registry.h"
#include "worker_group/orphan_guard.h"
#include "worker_group/stdin_relay.h"
#include "worker_group/worker_group.h"

namespace ddp::launcher {

struct AttemptResult;

// Signals ddprun forwards to its workers (and so blocks for its signalfd).
sigset_t forwarded_signals();

class Agent {
 public:
  // `signal_fd`: a signalfd for SIGCHLD + forwarded_signals(), which the
  // caller has blocked. Neither is owned.
  Agent(const LaunchSpec& spec, OrphanGuard& guard, int signal_fd);
  ~Agent();

  // Runs the job; returns ddprun's exit code (0, the failed worker's code,
  // 128 + signal, or 1 when the job failed on another node or the rendezvous
  // was lost). Throws ddp::Error when nothing could be started.
  int run();

  // `lost`: whether this ddprun was stopped because the front end of a
  // --hostfile job is gone (RemoteGate). Under --on_failure=heal with room
  // for fewer nodes, such a stop leaves the running round without ending it:
  // the rendezvous leaves this node out once its heartbeats stop, and the
  // other nodes go on.
  void on_front_end_lost(std::function<bool()> lost) { front_end_lost_ = std::move(lost); }

 private:
  int run_rounds();
  NodeInfo set_up(std::optional<PortReservation>* reservation, std::string* rdzv_target);
  std::optional<int> outcome_of(const RoundAssignment& round, const AttemptResult& result);
  AttemptResult run_attempt(const RoundAssignment& round, const std::string& rdzv_endpoint);
  int finish_after_success(const RoundAssignment& round, bool* restart);
  void observe_end(const AttemptResult& result);  // the event log's round_end and restart
  // Keeps a hosted rendezvous answering for control_->linger_time(), or,
  // kUntilDelivered, until every node of the round has heard how it ended;
  // a signal cuts it short.
  enum class Linger { kFullTime, kUntilDelivered };
  void linger(Linger until);
  // A stop by signal that leaves the round to go on without this node.
  bool leaves_as_lost() const;

  const LaunchSpec& spec_;
  OrphanGuard& guard_;
  int signal_fd_;
  std::unique_ptr<ControlPlane> control_;
  std::unique_ptr<RunFiles> files_;        // per-worker logs and error files
  std::unique_ptr<HealMarks> marks_;       // --on_failure=heal on a single node, else null
  std::optional<StdinRelay> stdin_relay_;  // the terminal typed into, for local rank 0
  std::unique_ptr<Observer> observer_;     // events, metrics, status samples
  std::unique_ptr<RuntimeRegistration> registration_;  // for ddprun status on this machine
  std::string hostname_;
  std::string node_address_;  // advertised to other nodes (and to workers as DDP_NODE_ADDR)
  std::function<bool()> front_end_lost_;
};

}  // namespace ddp::launcher
