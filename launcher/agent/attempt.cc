#include "agent/attempt.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <thread>

#include <fmt/ranges.h>

#include "ddp/common/error.h"
#include "ddp/common/launcher_log.h"
#include "ddp/common/proc_stat.h"
#include "ddp/common/shm_names.h"
#include "worker_group/cpu_binding.h"
#include "worker_group/failure_report.h"
#include "worker_group/log_tee.h"
#include "worker_group/process.h"

namespace ddp::launcher {
namespace {

// How long a node whose ranks wait for another node's waits for that node's
// hang report before sending its own (both find the hang within a sampling
// interval of each other).
constexpr std::chrono::seconds kRemoteHangWait{2};

// Whether the workers run Python (ddprun's python, or a python executable
// named as the program): their hang reports show Python tracebacks.
bool runs_python(const std::vector<std::string>& command) {
  const std::string& exe = command.front();
  const std::string base = exe.substr(exe.rfind('/') == std::string::npos ? 0 : exe.rfind('/') + 1);
  return base.rfind("python", 0) == 0;
}

// The last `n` of `lines`.
std::deque<std::string> tail(const std::deque<std::string>& lines, std::size_t n) {
  return {lines.end() - static_cast<long>(std::min(n, lines.size())), lines.end()};
}

}  // namespace

// Notices for the program (Slurm's --signal=USR1@90 before a time limit or
// preemption): forwarded, the job goes on.
bool is_notice_signal(int sig) { return sig == SIGUSR1 || sig == SIGUSR2; }

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

Attempt::Attempt(const AttemptContext& context, const RoundAssignment& round,
                 const std::string& rdzv_endpoint)
    : ctx_(context),
      round_(round),
      rdzv_endpoint_(rdzv_endpoint),
      grace_(context.spec.shutdown_timeout_s),
      in_(context.spec, context.files, round) {}

Attempt::~Attempt() = default;

// What ddprun sets for every worker beside the rank's own variables: the
// environment it inherits, CPUs (--bind_cores_to_rank), the progress board,
// and the defaults a user's own environment overrides.
void Attempt::settings() {
  const LaunchSpec& spec = ctx_.spec;
  const int n = spec.nproc_per_node;
  in_.base_env = base_environment();
  if (n > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) in_.omp_num_threads = "1";
  // --bind_cores_to_rank: ddprun's CPUs now, so a mask narrowed since the
  // last attempt is followed. Each rank's own mask is then only its slice, so
  // the workers are told how many CPUs the node's ranks share
  // (ddp::node_cpus(): whether libddp's waits may spin).
  in_.cpus.assign(static_cast<std::size_t>(n), {});
  if (spec.bind_cores_to_rank) {
    const std::vector<int> allowed = allowed_cpus();
    in_.cpus = cpu_slices(allowed, n);
    in_.node_cpus = static_cast<int>(allowed.size());
    std::string text;
    for (std::size_t r = 0; r < in_.cpus.size(); ++r) {
      text += fmt::format("{}local rank {}: {}", r > 0 ? "; " : "", r, fmt::join(in_.cpus[r], " "));
    }
    launcher_log().info("--bind_cores_to_rank: {} CPU(s) for {} local rank(s): {}", allowed.size(),
                        n, text);
  }
  // The progress board libddp counts collectives on (--hang_timeout, ddprun
  // status), and Python's fault handler (every thread's traceback on SIGABRT).
  if (spec.hang_timeout_s > 0 || spec.status_interval_s > 0) {
    board_ = ProgressBoard::create(n);
    in_.progress_fd = board_->fd();
    if (spec.hang_timeout_s > 0 && python_ && std::getenv("PYTHONFAULTHANDLER") == nullptr) {
      in_.python_fault_handler = "1";
    }
  }
}

void Attempt::start() {
  const LaunchSpec& spec = ctx_.spec;
  const std::vector<std::string> command = spec.command();
  python_ = runs_python(command);
  settings();
  auto& relay = ctx_.stdin_relay;
  relay.reset();
  if (isatty(STDIN_FILENO) == 1) relay.emplace();
  in_.rdzv_unavailable = ctx_.control.workers_server_missing();
  if (in_.rdzv_unavailable.empty()) in_.rdzv_endpoint = rdzv_endpoint_;
  in_.node_address = ctx_.node_address;
  in_.rank0_stdin = relay                               ? relay->worker_end()
                    : fcntl(STDIN_FILENO, F_GETFD) >= 0 ? STDIN_FILENO
                                                        : -1;
  in_.kept_stderr_lines = spec.hang_timeout_s > 0 ? HangWatch::kKeptStderrLines : kReportLines;
  if (ctx_.marks != nullptr) in_.heal_mark_dir = ctx_.marks->dir();
  try {
    if (ctx_.marks != nullptr)
      relauncher_.emplace(ctx_.control, *ctx_.marks, in_);  // no stale marks
    group_.emplace(command, worker_launches(in_), ctx_.guard, board_ ? board_->fd() : -1,
                   ctx_.host);
  } catch (...) {
    remove_leftover_segments(spec.run_id);
    throw;
  }
  if (relay) {
    relay->close_worker_end();
    in_.rank0_stdin = -1;  // a relaunched local rank 0 reads /dev/null
  }
  if (spec.hang_timeout_s > 0) watch_hangs();
  ctx_.observer.workers_started(*group_);
  // Single-node jobs need no heartbeats (the server lives in this process);
  // an elastic job's round of one node does: a scale-up ends it.
  if (spec.multi_node()) monitor_ = ctx_.control.watch(round_);
}

void Attempt::watch_hangs() {
  hang_.emplace(ctx_.spec.hang_timeout_s, *board_, python_, relauncher_.has_value());
}

bool Attempt::settled() const {
  return group_->stopping() || result_.signal != 0 || result_.remote_end || result_.first_failure;
}

// The attempt's first failure: stop the group and tell the other nodes at
// once (the server decides whether a round follows).
void Attempt::fail_with(const WorkerOutcome& outcome, std::string report) {
  result_.first_failure = outcome;
  result_.failure_report = std::move(report);
  ctx_.observer.failure(outcome, result_.failure_report);
  group_->stop(SIGTERM, grace_);
  try {
    result_.can_restart =
        ctx_.control.report_failure(round_, result_.failure_report, outcome.launcher_exit_code());
  } catch (const Error& e) {
    launcher_log().error("error: could not report the failure: {}", e.what());
  }
}

// A failed worker: relaunched alone (--on_failure=heal), else the attempt's failure.
void Attempt::worker_failed(std::size_t i) {
  Worker& w = (*group_)[i];
  group_->pump_all(i);  // what the rank wrote before it died: its last words for the report
  if (relauncher_ && relauncher_->relaunch(*group_, i)) {
    ctx_.observer.relaunched(w);
    if (hang_) watch_hangs();  // the new process's progress is counted afresh
    return;
  }
  if (auto hung = relauncher_ ? relauncher_->hang_of(i) : std::nullopt) {
    return fail_with(hung->first, hung->second);
  }
  fail_with(w.outcome, format_failure_report(w.outcome, tail(w.tees[1]->last_lines(), kReportLines),
                                             round_.restart_count, ctx_.spec.max_restarts));
}

// A stop signal sent to the workers and to ddprun together (Slurm's scancel
// signals every process of the step) may end a worker before ddprun has read
// its own, or even received it: a worker ended by a stop signal waits up to
// 100 ms for ddprun's, which then makes it the stop that ended it, not a
// failure.
void Attempt::await_shared_stop(const WorkerOutcome& outcome) {
  const bool stop_signal = std::find(std::begin(kStopSignals), std::end(kStopSignals),
                                     outcome.code) != std::end(kStopSignals);
  if (!outcome.signaled || !stop_signal || result_.signal != 0) return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  while (!stop_signal_pending() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (stop_signal_pending()) on_signals();
}

// A worker that exits with an error as the attempt's first failure may be
// reacting to a peer that a signal is killing at that moment: libddp sees a
// dead peer as soon as its main thread is a zombie, while the kernel lets
// ddprun reap it only once all its threads are gone. So while a running
// worker is such a zombie (and for this long at most), its end is awaited
// and the two are judged together.
constexpr auto kDyingPeerWait = std::chrono::seconds(1);

std::vector<std::size_t> Attempt::reap_with_peer_deaths() {
  std::vector<std::size_t> ended = group_->reap();
  const bool error_exit = std::any_of(ended.begin(), ended.end(), [&](std::size_t i) {
    const WorkerOutcome& o = (*group_)[i].outcome;
    return o.failed() && !o.signaled;
  });
  if (!error_exit || group_->stopping() || result_.first_failure) return ended;
  auto dying = [&] {
    for (std::size_t i = 0; i < group_->size(); ++i) {
      const Worker& w = (*group_)[i];
      if (w.running && process_exited(w.pid)) return true;
    }
    return false;
  };
  const auto until = std::chrono::steady_clock::now() + kDyingPeerWait;
  while (dying() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const std::vector<std::size_t> more = group_->reap();
    ended.insert(ended.end(), more.begin(), more.end());
  }
  return ended;
}

void Attempt::reap() {
  std::vector<std::size_t> ended = reap_with_peer_deaths();
  for (std::size_t i : ended) {
    ctx_.observer.worker_exited((*group_)[i]);
    if (!group_->stopping()) await_shared_stop((*group_)[i].outcome);
  }
  // Workers that ended together are taken signal deaths first: a rank
  // killed by a signal did not choose to end, while its peers exit with an
  // error once they see it gone, so the signal names the cause.
  std::stable_partition(ended.begin(), ended.end(),
                        [&](std::size_t i) { return (*group_)[i].outcome.signaled; });
  for (std::size_t i : ended) {
    // The first failure ends the attempt; not one caused by our own stop,
    // or by a hang's traceback dump.
    if (!(*group_)[i].outcome.failed() || group_->stopping() || result_.signal != 0 ||
        result_.remote_end || (hang_ && hang_->found())) {
      continue;
    }
    worker_failed(i);
  }
}

// The heartbeat thread's news: the round ended elsewhere, or the server is gone.
void Attempt::on_round_event() {
  if (result_.first_failure || result_.remote_end || !result_.lost.empty()) return;
  uint64_t count = 0;
  ssize_t ignored = read(monitor_->event_fd(), &count, sizeof(count));
  (void)ignored;
  if (auto end = monitor_->ended()) {
    result_.remote_end = end;
    if (!end->succeeded) group_->stop(SIGTERM, grace_);
  } else {
    result_.lost = monitor_->lost();
    group_->stop(SIGTERM, grace_);
  }
}

void Attempt::on_signals() {
  signalfd_siginfo info{};
  while (read(ctx_.signal_fd, &info, sizeof(info)) == sizeof(info)) {
    int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGCHLD) continue;  // reaped by the loop
    if (is_notice_signal(sig)) {
      int told = group_->signal_workers(sig);
      launcher_log().info("forwarded {} to {} worker(s); the job goes on", signal_name(sig), told);
      continue;
    }
    if (result_.signal == 0 && !group_->stopping()) {
      result_.signal = sig;
      group_->stop(sig, grace_);
    } else if (sig == SIGINT || sig == SIGTERM || sig == SIGQUIT) {
      // A second request to stop: do not wait out the grace period.
      if (result_.signal == 0) result_.signal = sig;
      group_->signal_groups(SIGKILL);
    }
  }
}

void Attempt::stop_if_console_closed() {
  if (result_.signal != 0 || group_->stopping() || !group_->console_closed()) return;
  // As torchrun's workers, which write to its stdout themselves, end on
  // EPIPE; ddprun exits 141 (128 + SIGPIPE), as a program killed by it does.
  launcher_log().warn(
      "the console was closed (the reader of ddprun's output exited): stopping the workers");
  result_.signal = SIGPIPE;
  group_->stop(SIGTERM, grace_);
}

void Attempt::check_hang() {
  if (!hang_ || result_.first_failure || (settled() && !hang_->found()) || !hang_->tick(*group_)) {
    return;
  }
  auto blamed = hang_->blamed(*group_);
  std::string report = hang_->report(*group_, round_.restart_count, ctx_.spec.max_restarts);
  ctx_.observer.hang(blamed.front(), report);
  if (!relauncher_ && hang_->waits_elsewhere() && round_.group_world_size > 1) {
    launcher_log().warn(
        "the ranks of this node wait for a rank on another node: waiting up to {} s for that "
        "node's report",
        std::chrono::duration<double>(kRemoteHangWait).count());
    deferred_hang_ =
        DeferredHang{blamed.front(), std::move(report), Clock::now() + kRemoteHangWait};
    return;
  }
  if (relauncher_ && relauncher_->take_hang(*group_, blamed, report)) {
    watch_hangs();
    for (const auto& b : blamed) {  // ended already: a Python rank's traceback dump
      const auto i = static_cast<std::size_t>(b.local_rank);
      if (!(*group_)[i].running && (*group_)[i].outcome.failed()) worker_failed(i);
    }
  } else {
    fail_with(blamed.front(), std::move(report));
  }
}

// No other node's report within kRemoteHangWait (the culprit's node may not
// see it as stuck: it spins, or its agent is gone): this node's report.
void Attempt::fail_with_deferred_hang() {
  if (!deferred_hang_ || Clock::now() < deferred_hang_->deadline) return;
  DeferredHang hang = std::move(*deferred_hang_);
  deferred_hang_.reset();
  if (result_.first_failure || result_.remote_end || !result_.lost.empty()) return;
  fail_with(hang.blamed, std::move(hang.report));
}

// How long the loop may sleep: until the next heartbeat check, hang check,
// kill deadline or status sample, whichever comes first.
int Attempt::poll_timeout() {
  int timeout_ms = std::max(1, static_cast<int>(ctx_.spec.monitor_interval_s * 1000));
  auto shorten_to = [&](Clock::time_point until) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    timeout_ms = static_cast<int>(std::clamp<long>(left, 0, timeout_ms));
  };
  if (hang_ && (!settled() || hang_->found())) shorten_to(hang_->next_wake());
  if (auto deadline = group_->kill_deadline()) shorten_to(*deadline);
  if (deferred_hang_) shorten_to(deferred_hang_->deadline);
  if (!settled()) shorten_to(ctx_.observer.next_sample());
  return timeout_ms;
}

AttemptResult Attempt::run() {
  start();
  auto& relay = ctx_.stdin_relay;
  std::vector<pollfd> pfds;
  std::vector<std::pair<std::size_t, int>> owners;  // (worker, stream) per pollfd after kFixed
  constexpr std::size_t kFixed = 3;  // signalfd, heartbeat eventfd, the terminal typed into
  // A deferred hang keeps the loop (and the heartbeat's news) going even
  // once its ranks' traceback dumps have ended them.
  while (group_->running() > 0 || deferred_hang_) {
    pfds.clear();
    owners.clear();
    pfds.push_back({ctx_.signal_fd, POLLIN, 0});
    pfds.push_back({monitor_ ? monitor_->event_fd() : -1, POLLIN, 0});
    pfds.push_back({relay ? relay->poll_fd() : -1, POLLIN, 0});
    group_->add_pipes(pfds, owners);
    int ready = poll(pfds.data(), pfds.size(), poll_timeout());
    if (ready < 0 && errno != EINTR) throw Error(std::string("poll: ") + std::strerror(errno));
    if (ready > 0) {
      for (std::size_t k = kFixed; k < pfds.size(); ++k) {
        if (pfds[k].revents != 0) group_->pump(owners[k - kFixed].first, owners[k - kFixed].second);
      }
      if (pfds[2].revents != 0) relay->pump();
      if (pfds[1].revents & POLLIN) on_round_event();
      if (pfds[0].revents & POLLIN) on_signals();
    }
    reap();
    if (auto replaced = ctx_.guard.replace_if_gone()) launcher_log().warn("{}", *replaced);
    stop_if_console_closed();
    check_hang();
    fail_with_deferred_hang();
    group_->kill_if_overdue();
    ctx_.observer.tick(*group_, board_ ? &*board_ : nullptr, ctx_.control, monitor_.get());
  }
  if (relauncher_) result_.relaunches = relauncher_->relaunches();
  group_->drain();
  group_.reset();
  relay.reset();
  // The group is gone, however it ended (success, failure, signal, lost
  // server): remove the run's segments its killed ranks left, before any
  // restart (whose ranks create new ones) and before ddprun exits.
  remove_leftover_segments(ctx_.spec.run_id);
  return result_;
}

}  // namespace ddp::launcher
