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

#include "agent/hang_watch.h"
#include "agent/healer.h"
#include "agent/local_control_plane.h"
#include "agent/port_reservation.h"
#include "agent/rpc_plugin.h"
#include "agent/worker_launches.h"
#include "ddp/common/endpoint.h"
#include "ddp/common/error.h"
#include "ddp/common/launcher_log.h"
#include "ddp/common/progress_board.h"
#include "ddp/common/shm_names.h"
#include "worker_group/cpu_binding.h"
#include "worker_group/failure_report.h"
#include "worker_group/log_tee.h"
#include "worker_group/process.h"
#include "worker_group/worker_group.h"

namespace ddp::launcher {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kReportLines = 20;

// Removes the shared-memory segments of the run that its workers left behind:
// libddp's shm backend unlinks its segments once every local rank attached,
// so only workers killed in between leave any. Called once a worker group is
// gone (its ranks cannot create more).
void remove_leftover_segments(const std::string& run_id) {
  int removed = remove_run_segments(run_id);
  if (removed > 0) {
    launcher_log().info("removed {} shared-memory segment(s) of run {} left by killed workers",
                        removed, run_id);
  } else {
    launcher_log().debug("no shared-memory segments of run {} left", run_id);
  }
}

// Whether the workers run Python (ddprun's python, or a python executable
// named as the program): their hang reports show Python tracebacks.
bool runs_python(const std::vector<std::string>& command) {
  const std::string& exe = command.front();
  const std::string base = exe.substr(exe.rfind('/') == std::string::npos ? 0 : exe.rfind('/') + 1);
  return base.rfind("python", 0) == 0;
}

// The last `n` of `lines`.
std::deque<std::string> tail(const std::deque<std::string>& lines, size_t n) {
  return {lines.end() - static_cast<long>(std::min(n, lines.size())), lines.end()};
}

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

struct Agent::AttemptResult {
  std::optional<WorkerOutcome> first_failure;  // a local worker failed first
  std::string failure_report;
  int signal = 0;                         // a signal to ddprun ended the attempt
  std::optional<RoundStatus> remote_end;  // the round ended elsewhere (or the job succeeded)
  std::string lost;                       // the rendezvous server stopped answering
  bool can_restart = false;               // the server will form another round
  int relaunches = 0;                     // ranks relaunched alone (--on_failure=heal)
};

namespace {

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
}

// SIGUSR1/SIGUSR2 are notices for the program (Slurm's --signal=USR1@90
// before a time limit or preemption): forwarded, the job goes on.
bool is_notice_signal(int sig) { return sig == SIGUSR1 || sig == SIGUSR2; }

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

int Agent::run_rounds() {
  auto& log = launcher_log();
  // MASTER_PORT is offered by the node that becomes group rank 0; the static
  // form knows which that is, so the others need no (possibly taken) port.
  // With the agent store, node rank 0's rendezvous listens on MASTER_PORT
  // itself: nothing is reserved for the program.
  const bool static_non_zero =
      spec_.multi_node() && spec_.rdzv_backend == RdzvBackend::kStatic && spec_.node_rank > 0;
  std::optional<PortReservation> reservation;
  if (!spec_.agent_store)
    reservation = PortReservation::reserve(static_non_zero ? 0 : spec_.master_port);
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
  const std::string rdzv_target = control_->worker_endpoint();
  registration_ = std::make_unique<RuntimeRegistration>(
      RuntimeEntry{getpid(), spec_.run_id, rdzv_target, spec_.rdzv_token, spec_.tls_ca});
  Endpoint endpoint = parse_endpoint(rdzv_target, 29400, "--rdzv_endpoint");

  NodeInfo node;
  node.node_rank = spec_.node_rank;
  node.local_world_size = spec_.nproc_per_node;
  node.hostname = hostname_;
  node_address_ = !spec_.local_addr.empty() ? spec_.local_addr
                  : spec_.multi_node()      ? advertised_address(endpoint)
                                            : spec_.master_addr;
  node.address = node_address_;
  node.master_port = reservation ? reservation->port() : spec_.master_port;

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
          round.reason.empty() ? "first round" : "after: " + round.reason);
    }
    observer_->round_started(round);
    AttemptResult result = run_attempt(round, rdzv_target);
    observe_end(result);
    if (result.signal != 0) {
      log.warn("stopped workers after {}", signal_name(result.signal));
      if (spec_.multi_node()) {
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
      continue;
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
      continue;
    }
    // Every local worker succeeded: tell the server, then wait for the job's outcome.
    bool restart = false;
    int code = finish_after_success(round, &restart);
    if (restart) observer_->restart("other_node", "a round ended on another node");
    if (!restart) observer_->round_ended(code == 0 ? "SUCCEEDED" : "FAILED", "");
    if (!restart) return code;
  }
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

Agent::AttemptResult Agent::run_attempt(const RoundAssignment& round,
                                        const std::string& rdzv_endpoint) {
  const int attempt = round.restart_count;
  const int n = spec_.nproc_per_node;
  std::vector<std::string> base_env = base_environment();
  if (n > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) base_env.push_back("OMP_NUM_THREADS=1");
  const std::vector<std::string> command = spec_.command();
  const bool python = runs_python(command);
  // --bind_cores_to_rank: ddprun's CPUs now, so a mask narrowed since the
  // last attempt is followed. Each rank's own mask is then only its slice, so
  // the workers are told how many CPUs the node's ranks share
  // (ddp::node_cpus(): whether libddp's waits may spin).
  std::vector<std::vector<int>> cpus(static_cast<std::size_t>(n));
  if (spec_.bind_cores_to_rank) {
    const std::vector<int> allowed = allowed_cpus();
    cpus = cpu_slices(allowed, n);
    std::erase_if(base_env, [](const std::string& e) { return e.rfind("DDP_NODE_CPUS=", 0) == 0; });
    base_env.push_back("DDP_NODE_CPUS=" + std::to_string(allowed.size()));
    std::string text;
    for (std::size_t r = 0; r < cpus.size(); ++r) {
      text += fmt::format("{}local rank {}: {}", r > 0 ? "; " : "", r, fmt::join(cpus[r], " "));
    }
    launcher_log().info("--bind_cores_to_rank: {} CPU(s) for {} local rank(s): {}", allowed.size(),
                        n, text);
  }
  // --hang_timeout: the progress board libddp counts collectives on, and
  // Python's fault handler (every thread's traceback on SIGABRT).
  std::optional<ProgressBoard> board;
  std::erase_if(base_env, [](const std::string& e) { return e.rfind("DDP_PROGRESS_FD=", 0) == 0; });
  if (spec_.hang_timeout_s > 0 || spec_.status_interval_s > 0) {  // also ddprun status
    board = ProgressBoard::create(n);
    base_env.push_back("DDP_PROGRESS_FD=" + std::to_string(board->fd()));
    if (spec_.hang_timeout_s > 0 && python && std::getenv("PYTHONFAULTHANDLER") == nullptr) {
      base_env.push_back("PYTHONFAULTHANDLER=1");
    }
  }

  stdin_relay_.reset();
  if (isatty(STDIN_FILENO) == 1) stdin_relay_.emplace();
  LaunchInputs in(spec_, *files_, round);  // kept for relaunches
  in.rdzv_unavailable = control_->workers_server_missing();
  if (in.rdzv_unavailable.empty()) in.rdzv_endpoint = rdzv_endpoint;
  in.node_address = node_address_;
  in.rank0_stdin = stdin_relay_                        ? stdin_relay_->worker_end()
                   : fcntl(STDIN_FILENO, F_GETFD) >= 0 ? STDIN_FILENO
                                                       : -1;
  in.base_env = std::move(base_env);
  in.cpus = std::move(cpus);
  in.kept_stderr_lines = spec_.hang_timeout_s > 0 ? HangWatch::kKeptStderrLines : kReportLines;
  if (marks_) in.heal_mark_dir = marks_->dir();
  std::optional<Healer> healer;
  std::optional<WorkerGroup> group;
  try {
    if (marks_) healer.emplace(*control_, *marks_, in);  // no stale marks
    group.emplace(command, worker_launches(in), guard_, board ? board->fd() : -1,
                  spec_.multi_node() ? hostname_ : "");
  } catch (...) {
    remove_leftover_segments(spec_.run_id);
    throw;
  }
  if (stdin_relay_) {
    stdin_relay_->close_worker_end();
    in.rank0_stdin = -1;  // a relaunched local rank 0 reads /dev/null
  }
  std::optional<HangWatch> hang;
  auto watch_hangs = [&]() {
    hang.emplace(spec_.hang_timeout_s, *board, python, healer.has_value());
  };
  if (spec_.hang_timeout_s > 0) watch_hangs();
  observer_->workers_started(*group);

  AttemptResult result;
  const auto grace = std::chrono::duration<double>(spec_.shutdown_timeout_s);
  // The attempt's first failure: stop the group and tell the other nodes at
  // once (the server decides whether a round follows).
  auto fail_with = [&](const WorkerOutcome& outcome, std::string report) {
    result.first_failure = outcome;
    result.failure_report = std::move(report);
    observer_->failure(outcome, result.failure_report);
    group->stop(SIGTERM, grace);
    try {
      result.can_restart =
          control_->report_failure(round, result.failure_report, outcome.launcher_exit_code());
    } catch (const Error& e) {
      launcher_log().error("error: could not report the failure: {}", e.what());
    }
  };
  // A failed worker: relaunched alone (--on_failure=heal), else the attempt's failure.
  auto worker_failed = [&](size_t i) {
    Worker& w = (*group)[i];
    group->pump_all(i);  // what the rank wrote before it died: its last words for the report
    if (healer && healer->relaunch(*group, i)) {
      observer_->relaunched(w);
      if (hang) watch_hangs();  // the new process's progress is counted afresh
      return;
    }
    if (auto hung = healer ? healer->hang_of(i) : std::nullopt) {
      return fail_with(hung->first, hung->second);
    }
    fail_with(w.outcome,
              format_failure_report(w.outcome, tail(w.tees[1]->last_lines(), kReportLines), attempt,
                                    spec_.max_restarts));
  };
  auto reap = [&]() {
    for (size_t i : group->reap()) {
      observer_->worker_exited((*group)[i]);
      // The first failure ends the attempt; not one caused by our own stop,
      // or by a hang's traceback dump.
      if (!(*group)[i].outcome.failed() || group->stopping() || result.signal != 0 ||
          result.remote_end || (hang && hang->found())) {
        continue;
      }
      worker_failed(i);
    }
  };

  // Single-node jobs need no heartbeats (the server lives in this process);
  // an elastic job's round of one node does: a scale-up ends it.
  std::unique_ptr<RoundWatch> monitor;
  if (spec_.multi_node()) monitor = control_->watch(round);
  std::vector<pollfd> pfds;
  std::vector<std::pair<size_t, int>> owners;  // (worker, stream) per pollfd after the first two
  const int monitor_ms = std::max(1, static_cast<int>(spec_.monitor_interval_s * 1000));
  constexpr size_t kFixed = 3;  // signalfd, heartbeat eventfd, the terminal typed into
  auto settled = [&]() {
    return group->stopping() || result.signal != 0 || result.remote_end || result.first_failure;
  };
  while (group->running() > 0) {
    pfds.clear();
    owners.clear();
    pfds.push_back({signal_fd_, POLLIN, 0});
    pfds.push_back({monitor ? monitor->event_fd() : -1, POLLIN, 0});
    pfds.push_back({stdin_relay_ ? stdin_relay_->poll_fd() : -1, POLLIN, 0});
    group->add_pipes(pfds, owners);
    int timeout_ms = monitor_ms;
    auto shorten_to = [&](Clock::time_point until) {
      auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<long>(left, 0, timeout_ms));
    };
    if (hang && (!settled() || hang->found())) shorten_to(hang->next_wake());
    if (auto deadline = group->kill_deadline()) shorten_to(*deadline);
    if (!settled()) shorten_to(observer_->next_sample());
    int ready = poll(pfds.data(), pfds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) throw Error(std::string("poll: ") + std::strerror(errno));
    if (ready > 0) {
      for (size_t k = kFixed; k < pfds.size(); ++k) {
        if (pfds[k].revents != 0) group->pump(owners[k - kFixed].first, owners[k - kFixed].second);
      }
      if (pfds[2].revents != 0) stdin_relay_->pump();
      if ((pfds[1].revents & POLLIN) && !result.first_failure && !result.remote_end &&
          result.lost.empty()) {
        uint64_t count = 0;
        ssize_t ignored = read(monitor->event_fd(), &count, sizeof(count));
        (void)ignored;
        if (auto end = monitor->ended()) {
          result.remote_end = end;
          if (!end->succeeded) group->stop(SIGTERM, grace);
        } else {
          result.lost = monitor->lost();
          group->stop(SIGTERM, grace);
        }
      }
      if (pfds[0].revents & POLLIN) {
        signalfd_siginfo info{};
        while (read(signal_fd_, &info, sizeof(info)) == sizeof(info)) {
          int sig = static_cast<int>(info.ssi_signo);
          if (sig == SIGCHLD) continue;  // reaped below
          if (is_notice_signal(sig)) {
            int told = group->signal_workers(sig);
            launcher_log().info("forwarded {} to {} worker(s); the job goes on", signal_name(sig),
                                told);
            continue;
          }
          if (result.signal == 0 && !group->stopping()) {
            result.signal = sig;
            group->stop(sig, grace);
          } else if (sig == SIGINT || sig == SIGTERM || sig == SIGQUIT) {
            // A second request to stop: do not wait out the grace period.
            if (result.signal == 0) result.signal = sig;
            group->signal_groups(SIGKILL);
          }
        }
      }
    }
    reap();
    if (hang && !result.first_failure && (!settled() || hang->found()) && hang->tick(*group)) {
      auto blamed = hang->blamed(*group);
      std::string report = hang->report(*group, attempt, spec_.max_restarts);
      observer_->hang(blamed.front(), report);
      if (healer && healer->take_hang(*group, blamed, report)) {
        watch_hangs();
        for (const auto& b : blamed) {  // ended already: a Python rank's traceback dump
          const auto i = static_cast<size_t>(b.local_rank);
          if (!(*group)[i].running && (*group)[i].outcome.failed()) worker_failed(i);
        }
      } else {
        fail_with(blamed.front(), std::move(report));
      }
    }
    group->kill_if_overdue();
    observer_->tick(*group, board ? &*board : nullptr, *control_, monitor.get());
  }

  if (healer) result.relaunches = healer->relaunches();
  group->drain();
  group.reset();
  stdin_relay_.reset();
  // The group is gone, however it ended (success, failure, signal, lost
  // server): remove the run's segments its killed ranks left, before any
  // restart (whose ranks create new ones) and before ddprun exits.
  remove_leftover_segments(spec_.run_id);
  return result;
}

}  // namespace ddp::launcher
