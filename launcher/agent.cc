#include "agent.h"

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
#include <thread>

#include <fmt/ranges.h>

#include "cpu_binding.h"
#include "ddp/common/env_contract.h"
#include "ddp/common/error.h"
#include "ddp/common/log.h"
#include "ddp/common/endpoint.h"
#include "ddp/common/shm_names.h"
#include "ddp/common/progress_board.h"
#include "failure_report.h"
#include "hang_detector.h"
#include "local_control_plane.h"
#include "log_tee.h"
#include "port_reservation.h"
#include "process.h"
#include "process_probe.h"
#include "rpc_plugin.h"

extern char** environ;

namespace ddp::launcher {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kReportLines = 20;
// With --hang_timeout, each rank's stderr keeps more: a Python rank's
// traceback dump, read back for the hang report.
constexpr size_t kHangKeptLines = 300;
// Ranks whose stacks a hang report shows, and the time each stack tool gets.
constexpr size_t kMaxStackedRanks = 8;
constexpr auto kStackToolTime = std::chrono::seconds(5);
// How long aborted Python ranks get to write their tracebacks.
constexpr auto kTracebackTime = std::chrono::seconds(3);

struct Worker {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  int fds[2] = {-1, -1};  // stdout, stderr read ends; -1 once at EOF
  std::unique_ptr<StreamTee> tees[2];
  bool running = false;
  WorkerOutcome outcome;
};

void make_dirs(const std::string& path) {
  std::string partial;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      partial = path.substr(0, i);
      if (!partial.empty() && mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
        throw Error("--log_dir: cannot create '" + partial + "': " + std::strerror(errno));
      }
    }
  }
}

int open_log_file(const std::string& path) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("--log_dir: cannot open '" + path + "': " + std::strerror(errno));
  return fd;
}

// The parent's environment minus the contract's variables (a job started from
// inside another job must not inherit stale ranks).
std::vector<std::string> base_environment() {
  std::vector<std::string> env;
  const auto& names = contract_variable_names();
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    std::string name = entry.substr(0, entry.find('='));
    bool ours = false;
    for (const auto& n : names) ours = ours || n == name;
    if (!ours) env.push_back(std::move(entry));
  }
  return env;
}

// Removes the shared-memory segments of the run that its workers left behind:
// libddp's shm backend unlinks its segments once every local rank attached,
// so only workers killed in between leave any. Called once a worker group is
// gone (its ranks cannot create more).
void remove_leftover_segments(const std::string& run_id) {
  int removed = remove_run_segments(run_id);
  if (removed > 0) {
    launcher_log().info("removed {} shared-memory segment(s) of run {} left by killed workers", removed, run_id);
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

// The faulthandler dump at the end of a rank's stderr ("Fatal Python error:"
// and the tracebacks after it), or nothing.
std::vector<std::string> python_traceback(const std::deque<std::string>& lines) {
  for (size_t i = lines.size(); i-- > 0;) {
    if (lines[i].rfind("Fatal Python error", 0) == 0) return {lines.begin() + static_cast<long>(i), lines.end()};
  }
  return {};
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
  int signal = 0;               // a signal to ddprun ended the attempt
  std::optional<RoundStatus> remote_end;  // the round ended elsewhere (or the job succeeded)
  std::string lost;             // the rendezvous server stopped answering
  bool can_restart = false;     // the server will form another round
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
    return run_rounds();
  } catch (...) {
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
  const bool static_non_zero = spec_.multi_node() && spec_.rdzv_backend == RdzvBackend::kStatic && spec_.node_rank > 0;
  PortReservation reservation = PortReservation::reserve(static_non_zero ? 0 : spec_.master_port);
  if (spec_.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    log.info("setting OMP_NUM_THREADS=1 for each worker (set it yourself to override)");
  }
  if (spec_.log_dir_defaulted) {
    log.info("--redirects/--tee without --log_dir: worker logs go to {}/{}", spec_.log_dir, spec_.run_id);
  }

  // Single node: rounds decided here, workers' server loaded in the background.
  // Several nodes: the gRPC control plane from the rpc plugin.
  if (spec_.multi_node()) {
    control_ = load_rpc_plugin().multi_node_control_plane(spec_);
  } else {
    control_ = std::make_unique<LocalControlPlane>(spec_);
  }
  const std::string rdzv_target = control_->worker_endpoint();
  Endpoint endpoint = parse_endpoint(rdzv_target, 29400, "--rdzv_endpoint");

  NodeInfo node;
  node.node_rank = spec_.node_rank;
  node.local_world_size = spec_.nproc_per_node;
  node.hostname = hostname_;
  node_address_ = !spec_.local_addr.empty() ? spec_.local_addr
                  : spec_.multi_node()      ? local_address_towards(endpoint)
                                            : spec_.master_addr;
  node.address = node_address_;
  node.master_port = reservation.port();

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
      log.warn("received {} while waiting for {}; left the rendezvous", signal_name(join_signal), e.what());
      return 128 + join_signal;
    } catch (const Error& e) {
      log.error("error: {}", e.what());
      linger(Linger::kFullTime);  // a hosting node: the others' joins learn the reason too
      return 1;
    }
    if (spec_.multi_node()) {
      log.info("round {}: {} node(s), world size {}; this node is node rank {} with ranks {}-{} ({})",
               round.round, round.group_world_size, round.world_size, round.group_rank,
               round.global_rank_offset, round.global_rank_offset + spec_.nproc_per_node - 1,
               round.reason.empty() ? "first round" : "after: " + round.reason);
    }
    AttemptResult result = run_attempt(round, rdzv_target);
    if (result.signal != 0) {
      log.warn("stopped workers after {}", signal_name(result.signal));
      if (spec_.multi_node()) {
        try {
          control_->report_failure(round,
                                   "node " + std::to_string(round.group_rank) + " (host " + hostname_ +
                                       ") was stopped by " + signal_name(result.signal),
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
        linger(Linger::kUntilDelivered);
        return result.first_failure->launcher_exit_code();
      }
      log.warn("restarting the worker group (restart {} of {})", round.restart_count + 1, spec_.max_restarts);
      continue;
    }
    if (result.remote_end) {
      if (result.remote_end->succeeded) return 0;
      log.error("round {} ended on another node: {}", round.round, result.remote_end->reason);
      if (!result.remote_end->can_restart) {
        linger(Linger::kUntilDelivered);
        return 1;
      }
      log.warn("joining the next round (restart {} of {})", round.restart_count + 1, spec_.max_restarts);
      continue;
    }
    // Every local worker succeeded: tell the server, then wait for the job's outcome.
    bool restart = false;
    int code = finish_after_success(round, &restart);
    if (!restart) return code;
  }
}

void Agent::linger(Linger until) {
  const auto deadline = Clock::now() + control_->linger_time();
  for (;;) {
    if (until == Linger::kUntilDelivered && control_->outcome_delivered()) return;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
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
        log.warn("joining the next round (restart {} of {})", round.restart_count + 1, spec_.max_restarts);
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

Agent::AttemptResult Agent::run_attempt(const RoundAssignment& round, const std::string& rdzv_endpoint) {
  const int attempt = round.restart_count;
  const int master_port = round.master_port;
  const int n = spec_.nproc_per_node;
  std::string attempt_dir;
  if (!spec_.log_dir.empty()) {
    attempt_dir = spec_.log_dir + "/" + spec_.run_id + "/attempt_" + std::to_string(attempt);
  }
  std::vector<std::string> base_env = base_environment();
  if (n > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) base_env.push_back("OMP_NUM_THREADS=1");
  const std::vector<std::string> command = spec_.command();
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
    launcher_log().info("--bind_cores_to_rank: {} CPU(s) for {} local rank(s): {}", allowed.size(), n,
                        text);
  }

  // --hang_timeout: the progress board libddp counts collectives on, and
  // Python's fault handler (every thread's traceback on SIGABRT).
  const bool watch_hangs = spec_.hang_timeout_s > 0;
  std::optional<ProgressBoard> board;
  std::erase_if(base_env, [](const std::string& e) { return e.rfind("DDP_PROGRESS_FD=", 0) == 0; });
  if (watch_hangs) {
    board = ProgressBoard::create(n);
    base_env.push_back("DDP_PROGRESS_FD=" + std::to_string(board->fd()));
    if (runs_python(command) && std::getenv("PYTHONFAULTHANDLER") == nullptr) {
      base_env.push_back("PYTHONFAULTHANDLER=1");
    }
  }

  std::vector<Worker> workers(n);
  AttemptResult result;
  std::optional<Clock::time_point> kill_deadline;

  auto stop_all = [&](int sig) {
    for (auto& w : workers) {
      if (!w.running) continue;
      signal_group(w.pid, sig);
      // A stopped worker (SIGSTOP, a debugger let go, Ctrl-Z) could not act on
      // the signal before its grace period ends: continue it, as Slurm does.
      if (sig != SIGKILL) signal_group(w.pid, SIGCONT);
    }
  };
  auto begin_shutdown = [&]() {
    if (kill_deadline) return;
    stop_all(SIGTERM);
    kill_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(spec_.shutdown_timeout_s));
  };

  try {
    for (int i = 0; i < n; ++i) {
      Worker& w = workers[i];
      w.local_rank = i;
      w.rank = round.global_rank_offset + i;
      WorkerEnv env;
      env.rank = w.rank;
      env.local_rank = i;
      env.group_rank = round.group_rank;
      env.role_rank = w.rank;
      env.world_size = round.world_size;
      env.local_world_size = n;
      env.group_world_size = round.group_world_size;
      env.role_world_size = env.world_size;
      env.role_name = spec_.role;
      env.master_addr = round.master_addr;
      env.master_port = master_port;
      env.restart_count = attempt;
      env.max_restarts = spec_.max_restarts;
      env.run_id = spec_.run_id;
      env.rdzv_unavailable = control_->workers_server_missing();
      if (env.rdzv_unavailable.empty()) env.rdzv_endpoint = rdzv_endpoint;
      env.rdzv_token = spec_.rdzv_token;
      env.round = round.round;
      env.output_prefixed = spec_.rank_prefix;  // ddp::log then leaves the rank out of its prefix
      if (spec_.multi_node()) {
        env.rdzv_tls_ca = spec_.tls_ca;
        env.node_addr = node_address_;
      }
      std::vector<std::string> worker_env = base_env;
      for (const auto& [name, value] : env.to_env()) worker_env.push_back(name + "=" + value);

      // Where each stream goes: the console unless redirected (and not tee'd)
      // or filtered out; the rank's log file whenever a log dir is set.
      bool shown = !spec_.local_ranks_filter ||
                   std::find(spec_.local_ranks_filter->begin(), spec_.local_ranks_filter->end(), i) !=
                       spec_.local_ranks_filter->end();
      std::string rank_dir;
      if (!attempt_dir.empty()) {
        rank_dir = attempt_dir + "/" + std::to_string(w.rank);
        make_dirs(rank_dir);
      }
      for (int s = 0; s < 2; ++s) {
        int bit = s == 0 ? kStdout : kStderr;
        bool redirected = (spec_.redirects.for_rank(i) & bit) && !(spec_.tee.for_rank(i) & bit);
        TeeTarget target;
        target.console_fd = (shown && !redirected) ? (s == 0 ? STDOUT_FILENO : STDERR_FILENO) : -1;
        target.prefix = spec_.rank_prefix ? "[rank " + std::to_string(w.rank) + "] " : "";
        if (!rank_dir.empty()) {
          target.file_path = rank_dir + (s == 0 ? "/stdout.log" : "/stderr.log");
          target.file_fd = open_log_file(target.file_path);
        }
        target.keep_last_lines = s == 1 ? (watch_hangs ? kHangKeptLines : kReportLines) : 0;
        w.tees[s] = std::make_unique<StreamTee>(std::move(target));
      }

      SpawnedProcess p =
          spawn_process(command, worker_env, cpus[static_cast<std::size_t>(i)], board ? board->fd() : -1);
      guard_.watch(p.pid);
      w.pid = p.pid;
      w.fds[0] = p.stdout_fd;
      w.fds[1] = p.stderr_fd;
      w.running = true;
      w.outcome.rank = w.rank;
      w.outcome.local_rank = i;
      w.outcome.pid = p.pid;
      w.outcome.host = spec_.multi_node() ? hostname_ : "";
    }
  } catch (...) {
    stop_all(SIGKILL);
    for (auto& w : workers) {
      if (w.running) waitpid(w.pid, nullptr, 0);
      for (int fd : w.fds) if (fd >= 0) close(fd);
      if (w.pid > 0) guard_.forget(w.pid);
    }
    remove_leftover_segments(spec_.run_id);
    throw;
  }

  // Hang watch: samples every tenth of the timeout (50 ms to 1 s).
  std::optional<HangDetector> detector;
  if (watch_hangs) detector.emplace(to_ms(spec_.hang_timeout_s));
  const auto sample_every = std::clamp(to_ms(spec_.hang_timeout_s / 10), std::chrono::milliseconds(50),
                                       std::chrono::milliseconds(1000));
  auto next_sample = Clock::now() + sample_every;
  struct HangDump {
    HangVerdict verdict;
    std::vector<StuckRank> stacks;   // native ranks', taken at once
    std::vector<int> aborted;        // Python ranks sent SIGABRT, tracebacks to come
    Clock::time_point deadline;      // for those tracebacks
  };
  std::optional<HangDump> hang;
  auto watching = [&]() {
    return detector && !hang && !kill_deadline && result.signal == 0 && !result.remote_end && !result.first_failure;
  };

  auto running_count = [&]() {
    int c = 0;
    for (auto& w : workers) c += w.running ? 1 : 0;
    return c;
  };
  auto pump = [&](Worker& w, int s) {
    char buf[65536];
    for (;;) {
      ssize_t got = read(w.fds[s], buf, sizeof(buf));
      if (got > 0) {
        w.tees[s]->write(buf, static_cast<size_t>(got));
        continue;
      }
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && errno == EAGAIN) return;
      close(w.fds[s]);  // EOF or error
      w.fds[s] = -1;
      w.tees[s]->flush();
      return;
    }
  };
  auto reap = [&]() {
    for (auto& w : workers) {
      if (!w.running) continue;
      int status = 0;
      pid_t r = waitpid(w.pid, &status, WNOHANG);
      if (r != w.pid) continue;
      w.running = false;
      w.outcome.signaled = WIFSIGNALED(status);
      w.outcome.code = w.outcome.signaled ? WTERMSIG(status) : WEXITSTATUS(status);
      // The first failure (not one caused by our own shutdown, or by the
      // traceback dump of a hang) ends the attempt.
      if (w.outcome.failed() && !kill_deadline && result.signal == 0 && !result.remote_end && !hang) {
        // Read what the rank wrote before it died so the report has its last words.
        for (int s = 0; s < 2; ++s) if (w.fds[s] >= 0) pump(w, s);
        result.first_failure = w.outcome;
        result.failure_report = format_failure_report(w.outcome, tail(w.tees[1]->last_lines(), kReportLines),
                                                      attempt, spec_.max_restarts);
        begin_shutdown();
        // Tell the other nodes at once; the server decides whether a round follows.
        try {
          result.can_restart =
              control_->report_failure(round, result.failure_report, w.outcome.launcher_exit_code());
        } catch (const Error& e) {
          launcher_log().error("error: could not report the failure: {}", e.what());
        }
      }
    }
  };

  auto sample_ranks = [&]() {
    std::vector<pid_t> pids;
    for (auto& w : workers) pids.push_back(w.pid);
    std::vector<GroupUsage> usage = process_group_usage(pids);
    std::vector<RankSample> samples(workers.size());
    for (size_t i = 0; i < workers.size(); ++i) {
      RankSample& sample = samples[i];
      const ProgressSlot& slot = board->slot(static_cast<int>(i));
      sample.rank = workers[i].rank;
      sample.exited = !workers[i].running;
      sample.libddp = slot.attached.load(std::memory_order_relaxed) != 0;
      // completed before begun: both only grow, so begun >= completed.
      sample.completed = slot.completed.load(std::memory_order_acquire);
      sample.begun = slot.begun.load(std::memory_order_acquire);
      sample.op = static_cast<ProgressOp>(slot.op.load(std::memory_order_relaxed));
      sample.cpu_ticks = usage[i].cpu_ticks;
      sample.stopped = usage[i].leader_stopped;
    }
    return samples;
  };
  // A hang was found: native ranks' stacks now (they are still stuck), and
  // SIGABRT to Python ranks, whose fault handler writes every thread's
  // traceback to stderr (SIGCONT too: a stopped one runs the handler).
  auto begin_hang_dump = [&](HangVerdict verdict) {
    launcher_log().warn("no progress for {:g} s (--hang_timeout): collecting where the ranks are stuck",
                        spec_.hang_timeout_s);
    std::vector<int> shown = verdict.blamed;
    for (int i : verdict.stuck) {
      if (std::find(shown.begin(), shown.end(), i) == shown.end()) shown.push_back(i);
    }
    if (shown.size() > kMaxStackedRanks) shown.resize(kMaxStackedRanks);
    HangDump dump{std::move(verdict), {}, {}, Clock::now() + kTracebackTime};
    const bool python = runs_python(command);
    for (int i : shown) {
      Worker& w = workers[static_cast<size_t>(i)];
      if (!w.running) continue;
      if (python) {
        kill(w.pid, SIGABRT);
        kill(w.pid, SIGCONT);
        dump.aborted.push_back(i);
      } else {
        dump.stacks.push_back({w.rank, "native stacks", native_stacks(w.pid, kStackToolTime)});
      }
    }
    hang = std::move(dump);
  };
  auto finish_hang_dump = [&]() {
    for (int i : hang->aborted) {
      Worker& w = workers[static_cast<size_t>(i)];
      for (int s = 0; s < 2; ++s) if (w.fds[s] >= 0) pump(w, s);
      auto lines = python_traceback(w.tees[1]->last_lines());
      if (lines.empty()) lines = {"(no traceback: the rank did not answer SIGABRT with a faulthandler dump)"};
      hang->stacks.push_back({w.rank, "Python traceback (faulthandler)", std::move(lines)});
    }
    std::vector<WorkerOutcome> blamed;
    for (int i : hang->verdict.blamed) {
      WorkerOutcome o = workers[static_cast<size_t>(i)].outcome;
      o.hung = true;
      blamed.push_back(o);
    }
    // The blamed ranks' stacks first, then the others', each by rank.
    auto is_blamed = [&](int rank) {
      return std::any_of(blamed.begin(), blamed.end(), [&](const WorkerOutcome& o) { return o.rank == rank; });
    };
    std::sort(hang->stacks.begin(), hang->stacks.end(), [&](const StuckRank& a, const StuckRank& b) {
      return std::pair(!is_blamed(a.rank), a.rank) < std::pair(!is_blamed(b.rank), b.rank);
    });
    result.first_failure = blamed.front();
    result.failure_report = format_hang_report(blamed, spec_.hang_timeout_s, hang->verdict.lines, hang->stacks,
                                               attempt, spec_.max_restarts);
    begin_shutdown();
    try {
      result.can_restart = control_->report_failure(round, result.failure_report, blamed.front().launcher_exit_code());
    } catch (const Error& e) {
      launcher_log().error("error: could not report the failure: {}", e.what());
    }
  };

  // Single-node jobs need no heartbeats (the server lives in this process);
  // an elastic job's round of one node does: a scale-up ends it.
  std::unique_ptr<RoundWatch> monitor;
  if (spec_.multi_node()) monitor = control_->watch(round);
  std::vector<pollfd> pfds;
  std::vector<std::pair<int, int>> owners;  // (worker index, stream) per pollfd after the first two
  const int monitor_ms = std::max(1, static_cast<int>(spec_.monitor_interval_s * 1000));
  constexpr size_t kFixed = 2;  // signalfd, heartbeat eventfd
  while (running_count() > 0) {
    pfds.clear();
    owners.clear();
    pfds.push_back({signal_fd_, POLLIN, 0});
    pfds.push_back({monitor ? monitor->event_fd() : -1, POLLIN, 0});
    for (int i = 0; i < n; ++i) {
      for (int s = 0; s < 2; ++s) {
        if (workers[i].fds[s] >= 0) {
          pfds.push_back({workers[i].fds[s], POLLIN, 0});
          owners.emplace_back(i, s);
        }
      }
    }
    int timeout_ms = monitor_ms;
    if (watching() || hang) {
      auto until = hang ? hang->deadline : next_sample;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<long>(left, 0, timeout_ms));
    }
    if (kill_deadline) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*kill_deadline - Clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<long>(left, 0, timeout_ms));
    }
    int ready = poll(pfds.data(), pfds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) throw Error(std::string("poll: ") + std::strerror(errno));
    if (ready > 0) {
      for (size_t k = kFixed; k < pfds.size(); ++k) {
        if (pfds[k].revents != 0) pump(workers[owners[k - kFixed].first], owners[k - kFixed].second);
      }
      if ((pfds[1].revents & POLLIN) && !result.first_failure && !result.remote_end && result.lost.empty()) {
        uint64_t count = 0;
        ssize_t ignored = read(monitor->event_fd(), &count, sizeof(count));
        (void)ignored;
        if (auto end = monitor->ended()) {
          result.remote_end = end;
          if (!end->succeeded) begin_shutdown();
        } else {
          result.lost = monitor->lost();
          begin_shutdown();
        }
        pfds[1].fd = -1;
      }
      if (pfds[0].revents & POLLIN) {
        signalfd_siginfo info{};
        while (read(signal_fd_, &info, sizeof(info)) == sizeof(info)) {
          int sig = static_cast<int>(info.ssi_signo);
          if (sig == SIGCHLD) continue;  // reaped below
          if (is_notice_signal(sig)) {
            // To each worker itself, not its process group: children (data
            // loaders) that do not expect it would die of it.
            int told = 0;
            for (auto& w : workers) {
              if (w.running && kill(w.pid, sig) == 0) ++told;
            }
            launcher_log().info("forwarded {} to {} worker(s); the job goes on", signal_name(sig), told);
            continue;
          }
          if (result.signal == 0 && !kill_deadline) {
            result.signal = sig;
            stop_all(sig);
            kill_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(spec_.shutdown_timeout_s));
          } else if (sig == SIGINT || sig == SIGTERM || sig == SIGQUIT) {
            // A second request to stop: do not wait out the grace period.
            if (result.signal == 0) result.signal = sig;
            stop_all(SIGKILL);
          }
        }
      }
    }
    reap();
    if (watching() && Clock::now() >= next_sample) {
      next_sample = Clock::now() + sample_every;
      if (auto verdict = detector->observe(Clock::now(), sample_ranks())) begin_hang_dump(std::move(*verdict));
    }
    if (hang && !result.first_failure) {
      bool dumped = true;
      for (int i : hang->aborted) dumped = dumped && !workers[static_cast<size_t>(i)].running;
      if (dumped || Clock::now() >= hang->deadline || result.signal != 0) finish_hang_dump();
    }
    if (kill_deadline && Clock::now() >= *kill_deadline) stop_all(SIGKILL);
  }

  // Every worker has exited: kill what is left of their process groups (daemonised
  // children), then drain the pipes until they end, or stay silent for
  // 500 ms (a writer that escaped the group). Time spent waiting for a slow
  // console does not count, so what is in the pipes is shown; a writer that
  // never stops is cut off after 10 s.
  for (auto& w : workers) signal_group(w.pid, SIGKILL);
  auto drain_deadline = Clock::now() + std::chrono::milliseconds(500);
  const auto drain_cap = Clock::now() + std::chrono::seconds(10);
  for (;;) {
    pfds.clear();
    owners.clear();
    for (int i = 0; i < n; ++i) {
      for (int s = 0; s < 2; ++s) {
        if (workers[i].fds[s] >= 0) {
          pfds.push_back({workers[i].fds[s], POLLIN, 0});
          owners.emplace_back(i, s);
        }
      }
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(drain_deadline - Clock::now()).count();
    if (pfds.empty() || left <= 0) break;
    if (poll(pfds.data(), pfds.size(), static_cast<int>(left)) <= 0) continue;
    for (size_t k = 0; k < pfds.size(); ++k) {
      if (pfds[k].revents != 0) pump(workers[owners[k].first], owners[k].second);
    }
    drain_deadline = std::min(drain_cap, Clock::now() + std::chrono::milliseconds(500));
  }
  for (auto& w : workers) {
    for (int s = 0; s < 2; ++s) {
      if (w.fds[s] >= 0) {
        close(w.fds[s]);
        w.fds[s] = -1;
        w.tees[s]->flush();
      }
    }
    guard_.forget(w.pid);
  }
  // The group is gone, however it ended (success, failure, signal, lost
  // server): remove the run's segments its killed ranks left, before any
  // restart (whose ranks create new ones) and before ddprun exits.
  remove_leftover_segments(spec_.run_id);
  return result;
}

}  // namespace ddp::launcher
