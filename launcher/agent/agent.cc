#include "agent/agent.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include <fmt/ranges.h>

#include "agent/attempt.h"
#include "agent/local_control_plane.h"
#include "agent/port_reservation.h"
#include "agent/rank_relauncher.h"
#include "agent/rpc_plugin.h"
#include "agent/worker_launches.h"
#include "ddp/common/endpoint.h"
#include "ddp/common/error.h"
#include "ddp/common/launcher_log.h"
#include "ddp/common/progress_board.h"
#include "ddp/common/shm_names.h"
#include "observe/hang_watch.h"
#include "worker_group/cpu_binding.h"
#include "worker_group/failure_report.h"
#include "worker_group/log_tee.h"
#include "worker_group/process.h"
#include "worker_group/worker_group.h"

namespace ddp::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// The address this node gives the other nodes: the one that routes to the
// rendezvous, unless the rendezvous is named by a name that resolves to
// loopback here (the host's own name on Debian and Ubuntu is on a 127.0.1.1
// line): then an address of an up interface, which peers can reach.
std::string advertised_address(const Endpoint& endpoint) {
  std::string address = local_address_towards(endpoint);
  // A loopback address or "localhost" given on purpose (all nodes on this machine) is kept.
  in6_addr numeric{};
  const bool literal = inet_pton(AF_INET, endpoint.host.c_str(), &numeric) == 1 ||
                       inet_pton(AF_INET6, endpoint.host.c_str(), &numeric) == 1;
  if (!is_loopback_address(address) || literal || endpoint.host.rfind("localhost", 0) == 0)
    return address;
  const std::string other = first_non_loopback_address();
  if (other.empty()) return address;  // a machine with loopback only: its peers are local too
  launcher_log().info(
      "{} resolves to this host's loopback address {}; advertising {} to the other nodes "
      "(--local_addr chooses another)",
      endpoint.host, address, other);
  return other;
}

}  // namespace

sigset_t forwarded_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kStopSignals) sigaddset(&set, sig);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGUSR2);
  return set;
}

namespace {

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
}

// Drains the signalfd; returns the first pending signal that asks ddprun to
// stop (anything but SIGCHLD and the notices), or 0.
int read_stop_signal(int signal_fd) {
  int stop = 0;
  signalfd_siginfo info{};
  while (read(signal_fd, &info, sizeof(info)) == sizeof(info)) {
    const int sig = static_cast<int>(info.ssi_signo);
    if (sig != SIGCHLD && !is_notice_signal(sig) && stop == 0) stop = sig;
  }
  return stop;
}

std::string local_hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

}  // namespace

Agent::Agent(const LaunchSpec& spec, OrphanGuard& guard, int signal_fd)
    : spec_(spec), guard_(guard), signal_fd_(signal_fd), hostname_(local_hostname()) {}

Agent::~Agent() = default;

int Agent::run() {
  try {
    const int code = run_rounds();
    files_.reset();  // main() leaves with _exit: the temporary error files go now
    marks_.reset();
    observer_.reset();  // the event log's last records are written
    registration_.reset();
    return code;
  } catch (...) {
    files_.reset();
    marks_.reset();
    observer_.reset();
    registration_.reset();
    // Every finished attempt cleaned up after itself; one cut short by an error
    // may have left segments (and, if its workers still run, the orphan guard
    // sweeps again once it has killed them).
    remove_leftover_segments(spec_.run_id);
    throw;
  }
}

// What the rounds need before the first join: the port, the run's files,
// the observer, the control plane, and what this node tells the others.
NodeInfo Agent::set_up(std::optional<PortReservation>* reservation, std::string* rdzv_target) {
  auto& log = launcher_log();
  // MASTER_PORT is offered by the node that becomes group rank 0; the static
  // form knows which that is, so the others need no (possibly taken) port.
  // With the agent store, node rank 0's rendezvous listens on MASTER_PORT
  // itself: nothing is reserved for the program.
  const bool static_non_zero =
      spec_.multi_node() && spec_.rdzv_backend == RdzvBackend::kStatic && spec_.node_rank > 0;
  if (!spec_.agent_store)
    *reservation = PortReservation::reserve(static_non_zero ? 0 : spec_.master_port);
  if (spec_.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    log.info("setting OMP_NUM_THREADS=1 for each worker (set it yourself to override)");
  }
  files_ = std::make_unique<RunFiles>(spec_.log_dir, spec_.run_id);
  if (spec_.log_dir_defaulted) {
    log.info("--redirects/--tee without --log_dir: worker logs go to {}", files_->root());
  } else if (files_->keeps_logs()) {
    log.info("worker logs go to {}", files_->root());
  }
  if (spec_.on_failure == OnFailure::kHeal) marks_ = std::make_unique<HealMarks>(spec_.run_id);

  // Before any worker starts: a metrics port in use is an error now.
  observer_ = std::make_unique<Observer>(spec_, hostname_);
  // Single node: rounds decided here, workers' server loaded in the background.
  // Several nodes: the gRPC control plane from the rpc plugin.
  if (spec_.multi_node()) {
    control_ = load_rpc_plugin().multi_node_control_plane(spec_);
  } else {
    control_ = std::make_unique<LocalControlPlane>(spec_);
  }
  *rdzv_target = control_->worker_endpoint();
  registration_ = std::make_unique<RuntimeRegistration>(
      RuntimeEntry{getpid(), spec_.run_id, *rdzv_target, spec_.rdzv_token, spec_.tls_ca});
  Endpoint endpoint = parse_endpoint(*rdzv_target, 29400, "--rdzv_endpoint");

  NodeInfo node;
  node.node_rank = spec_.node_rank;
  node.local_world_size = spec_.nproc_per_node;
  node.hostname = hostname_;
  node_address_ = !spec_.local_addr.empty() ? spec_.local_addr
                  : spec_.multi_node()      ? advertised_address(endpoint)
                                            : spec_.master_addr;
  node.address = node_address_;
  node.master_port = *reservation ? (*reservation)->port() : spec_.master_port;
  return node;
}

// What an attempt's end means for the job: ddprun's exit code, or nullopt
// when a next round follows.
std::optional<int> Agent::outcome_of(const RoundAssignment& round, const AttemptResult& result) {
  auto& log = launcher_log();
  if (result.signal != 0) {
    log.warn("stopped workers after {}", signal_name(result.signal));
    if (leaves_as_lost()) {
      // Ending the round would stop every node; a lost node stops only itself.
      log.warn(
          "the front end is gone: this node leaves round {} without ending it; the rendezvous "
          "leaves it out once its heartbeats stop and the other nodes go on (--on_failure=heal, "
          "--nnodes={}:{})",
          round.round, spec_.min_nodes, spec_.nnodes);
    } else if (spec_.multi_node()) {
      try {
        control_->report_failure(round,
                                 "node " + std::to_string(round.group_rank) + " (host " +
                                     hostname_ + ") was stopped by " + signal_name(result.signal),
                                 128 + result.signal);
      } catch (const Error&) {
      }
    }
    return 128 + result.signal;
  }
  if (!result.lost.empty()) {
    log.error("error: {}; stopped this node's workers", result.lost);
    return 1;
  }
  if (result.first_failure) {
    log.error("{}", result.failure_report);
    if (!result.can_restart) {
      files_->write_root_cause(*result.first_failure, round.restart_count, result.failure_report);
      linger(Linger::kUntilDelivered);
      return result.first_failure->launcher_exit_code();
    }
    log.warn("restarting the worker group (restart {} of {})",
             round.restart_count + result.relaunches + 1, spec_.max_restarts);
    return std::nullopt;
  }
  if (result.remote_end) {
    if (result.remote_end->succeeded) return 0;
    log.error("round {} ended on another node: {}", round.round, result.remote_end->reason);
    if (!result.remote_end->can_restart) {
      linger(Linger::kUntilDelivered);
      return 1;
    }
    log.warn("joining the next round (restart {} of {})", round.restart_count + 1,
             spec_.max_restarts);
    return std::nullopt;
  }
  // Every local worker succeeded: tell the server, then wait for the job's outcome.
  bool restart = false;
  int code = finish_after_success(round, &restart);
  if (restart) {
    observer_->restart("other_node", "a round ended on another node");
    return std::nullopt;
  }
  observer_->round_ended(code == 0 ? "SUCCEEDED" : "FAILED", "");
  return code;
}

int Agent::run_rounds() {
  auto& log = launcher_log();
  std::optional<PortReservation> reservation;
  std::string rdzv_target;
  const NodeInfo node = set_up(&reservation, &rdzv_target);
  // A signal during a join (or between rounds) ends ddprun at once; the
  // server withdraws the node, so the others see it leave.
  int join_signal = 0;
  JoinWait wait;
  wait.fd = signal_fd_;
  wait.interrupted = [&]() {
    join_signal = read_stop_signal(signal_fd_);
    return join_signal != 0;
  };
  wait.notice = [&](const std::string& line) { log.warn("{}", line); };
  for (;;) {
    RoundAssignment round;
    try {
      round = control_->join(node, to_ms(spec_.rdzv_conf.join_timeout_s), wait);
    } catch (const JoinInterrupted& e) {
      log.warn("received {} while waiting for {}; left the rendezvous", signal_name(join_signal),
               e.what());
      return 128 + join_signal;
    } catch (const Error& e) {
      log.error("error: {}", e.what());
      linger(Linger::kFullTime);  // a hosting node: the others' joins learn the reason too
      return 1;
    }
    if (spec_.multi_node()) {
      log.info(
          "round {}: {} node(s), world size {}; this node is node rank {} with ranks {}-{} ({})",
          round.round, round.group_world_size, round.world_size, round.group_rank,
          round.global_rank_offset, round.global_rank_offset + spec_.nproc_per_node - 1,
          round.joined_running   ? "joined while it runs: the workers heal from the live ranks "
                                   "(--on_failure=heal)"
          : round.reason.empty() ? "first round"
                                 : "after: " + round.reason);
    }
    observer_->round_started(round);
    const AttemptResult result = run_attempt(round, rdzv_target);
    observe_end(result);
    if (const std::optional<int> code = outcome_of(round, result)) return *code;
  }
}

bool Agent::leaves_as_lost() const {
  return front_end_lost_ && front_end_lost_() && spec_.multi_node() && !spec_.hosts_rendezvous() &&
         spec_.on_failure == OnFailure::kHeal && spec_.min_nodes < spec_.nnodes;
}

void Agent::observe_end(const AttemptResult& result) {
  if (result.signal != 0) return observer_->round_ended("STOPPED", signal_name(result.signal));
  if (!result.lost.empty()) return observer_->round_ended("FAILED", result.lost);
  if (result.first_failure) {
    observer_->round_ended("FAILED", result.failure_report);
    if (result.can_restart) {
      observer_->restart(result.first_failure->hung ? "hang" : "worker_failure",
                         result.failure_report);
    }
  } else if (result.remote_end) {
    observer_->round_ended(result.remote_end->succeeded ? "SUCCEEDED" : "FAILED",
                           result.remote_end->reason);
    if (!result.remote_end->succeeded && result.remote_end->can_restart) {
      observer_->restart("other_node", result.remote_end->reason);
    }
  }
}

void Agent::linger(Linger until) {
  const auto deadline = Clock::now() + control_->linger_time();
  for (;;) {
    if (until == Linger::kUntilDelivered && control_->outcome_delivered()) return;
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return;
    // Nodes hear the outcome within a few ms (held heartbeats): look often.
    pollfd pfd{signal_fd_, POLLIN, 0};
    const int step = until == Linger::kUntilDelivered ? std::min<long>(left, 5) : left;
    if (poll(&pfd, 1, step) <= 0) continue;
    if (read_stop_signal(signal_fd_) != 0) return;  // the outcome is already decided: leave now
  }
}

int Agent::finish_after_success(const RoundAssignment& round, bool* restart) {
  auto& log = launcher_log();
  *restart = false;
  try {
    control_->leave(round, 0);
  } catch (const Error& e) {
    log.error("error: {}", e.what());
    return 1;
  }
  if (round.group_world_size <= 1) return 0;
  // Other nodes may still be running: wait until the job succeeds or the round fails.
  std::unique_ptr<RoundWatch> monitor = control_->watch(round);
  for (;;) {
    pollfd pfds[2] = {{monitor->event_fd(), POLLIN, 0}, {signal_fd_, POLLIN, 0}};
    if (poll(pfds, 2, -1) < 0 && errno != EINTR) return 1;
    if (pfds[1].revents & POLLIN) {
      if (int sig = read_stop_signal(signal_fd_); sig != 0) {
        log.warn("received {} while waiting for the other nodes", signal_name(sig));
        return 128 + sig;
      }
    }
    if (!(pfds[0].revents & POLLIN)) continue;
    if (auto end = monitor->ended()) {
      if (end->succeeded) {
        linger(Linger::kUntilDelivered);
        return 0;
      }
      log.error("round {} ended on another node: {}", round.round, end->reason);
      if (end->can_restart) {
        log.warn("joining the next round (restart {} of {})", round.restart_count + 1,
                 spec_.max_restarts);
        *restart = true;
        return 0;
      }
      linger(Linger::kUntilDelivered);
      return 1;
    }
    // This node's work is done; a vanished server can no longer change that, but
    // the job's outcome is unknown.
    log.error("error: {}", monitor->lost());
    return 1;
  }
}

AttemptResult Agent::run_attempt(const RoundAssignment& round, const std::string& rdzv_endpoint) {
  const AttemptContext context{spec_,        *files_,    *control_,
                               guard_,       *observer_, marks_.get(),
                               stdin_relay_, signal_fd_, spec_.multi_node() ? hostname_ : "",
                               node_address_};
  Attempt attempt(context, round, rdzv_endpoint);
  return attempt.run();
}

}  // namespace ddp::launcher
