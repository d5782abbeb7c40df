#pragma once
// One attempt of this node's worker group in a round (internal to the
// agent): the workers' environment and CPUs, spawning them, and the
// supervision loop (output, exits, signals, heartbeats, hangs, heal
// relaunches) until every worker is gone. The agent decides what follows
// from the AttemptResult.

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/control_plane.h"
#include "agent/heal_marks.h"
#include "agent/observer.h"
#include "agent/rank_relauncher.h"
#include "agent/run_files.h"
#include "agent/worker_launches.h"
#include "cli/launch_spec.h"
#include "ddp/common/progress_board.h"
#include "observe/hang_watch.h"
#include "worker_group/orphan_guard.h"
#include "worker_group/stdin_relay.h"
#include "worker_group/worker_group.h"

namespace ddp::launcher {

struct AttemptResult {
  std::optional<WorkerOutcome> first_failure;  // a local worker failed first
  std::string failure_report;
  int signal = 0;                         // a signal to ddprun ended the attempt
  std::optional<RoundStatus> remote_end;  // the round ended elsewhere (or the job succeeded)
  std::string lost;                       // the rendezvous server stopped answering
  bool can_restart = false;               // the server will form another round
  int relaunches = 0;                     // ranks relaunched alone (--on_failure=heal)
};

// What the agent lends an attempt; everything outlives it.
struct AttemptContext {
  const LaunchSpec& spec;
  const RunFiles& files;
  ControlPlane& control;
  OrphanGuard& guard;
  Observer& observer;
  const HealMarks* marks;                  // --on_failure=heal, else null
  std::optional<StdinRelay>& stdin_relay;  // reset and reopened by each attempt
  int signal_fd;
  std::string host;  // for the outcomes: "" on a single node
  std::string node_address;
};

// Lines of a failed worker's stderr in its report.
inline constexpr std::size_t kReportLines = 20;

// SIGUSR1/SIGUSR2: forwarded to the workers as notices; the job goes on.
bool is_notice_signal(int sig);
// Removes the run's shared-memory segments its killed workers left behind.
void remove_leftover_segments(const std::string& run_id);

class Attempt {
 public:
  Attempt(const AttemptContext& context, const RoundAssignment& round,
          const std::string& rdzv_endpoint);
  ~Attempt();
  Attempt(const Attempt&) = delete;
  Attempt& operator=(const Attempt&) = delete;

  // Spawns the workers and supervises them until every one is gone.
  AttemptResult run();

 private:
  using Clock = std::chrono::steady_clock;
  void settings();
  void start();
  int poll_timeout();
  void on_round_event();
  void on_signals();
  void reap();
  // The workers that ended; when one exited with an error, also those that
  // were dying meanwhile (see kDyingPeerWait).
  std::vector<std::size_t> reap_with_peer_deaths();
  void await_shared_stop(const WorkerOutcome& outcome);
  void worker_failed(std::size_t i);
  void fail_with(const WorkerOutcome& outcome, std::string report);
  void check_hang();
  // The console closed (`ddprun ... | head` after head exited): stop the
  // workers as for a stop signal, since their output has nowhere to go.
  void stop_if_console_closed();
  void fail_with_deferred_hang();
  bool settled() const;
  void watch_hangs();

  const AttemptContext& ctx_;
  const RoundAssignment round_;
  const std::string rdzv_endpoint_;
  const std::chrono::duration<double> grace_;
  bool python_ = false;
  std::optional<ProgressBoard> board_;
  LaunchInputs in_;  // kept for relaunches
  std::optional<RankRelauncher> relauncher_;
  std::optional<WorkerGroup> group_;
  std::optional<HangWatch> hang_;
  std::unique_ptr<RoundWatch> monitor_;
  AttemptResult result_;
  // A hang whose culprit is on another node: held for kRemoteHangWait, in
  // which that node's report (naming the rank, with its stacks) usually ends
  // the round; sent as this node's failure if none came.
  struct DeferredHang {
    WorkerOutcome blamed;
    std::string report;
    Clock::time_point deadline;
  };
  std::optional<DeferredHang> deferred_hang_;
};

}  // namespace ddp::launcher
