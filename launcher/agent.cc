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

#include "ddp/common/env_contract.h"
#include "ddp/common/error.h"
#include "ddp/common/log.h"
#include "failure_report.h"
#include "log_tee.h"
#include "port_reservation.h"
#include "process.h"

extern char** environ;

namespace ddp::launcher {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kReportLines = 20;

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

}  // namespace

sigset_t forwarded_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) sigaddset(&set, sig);
  return set;
}

struct Agent::AttemptResult {
  std::optional<WorkerOutcome> first_failure;
  std::deque<std::string> failure_stderr;
  int signal = 0;  // a signal to ddprun ended the attempt
};

int Agent::run() {
  auto& log = launcher_log();
  PortReservation reservation = PortReservation::reserve(spec_.master_port);
  if (spec_.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    log.info("setting OMP_NUM_THREADS=1 for each worker (set it yourself to override)");
  }
  if (spec_.log_dir_defaulted) {
    log.info("--redirects/--tee without --log_dir: worker logs go to {}/{}", spec_.log_dir, spec_.run_id);
  }
  for (int attempt = 0;; ++attempt) {
    AttemptResult result = run_attempt(attempt, reservation.port());
    if (result.signal != 0) {
      log.warn("stopped workers after {}", signal_name(result.signal));
      return 128 + result.signal;
    }
    if (!result.first_failure) return 0;
    log.error("{}", format_failure_report(*result.first_failure, result.failure_stderr, attempt,
                                         spec_.max_restarts));
    if (attempt >= spec_.max_restarts) return result.first_failure->launcher_exit_code();
    log.warn("restarting the worker group (restart {} of {})", attempt + 1, spec_.max_restarts);
  }
}

Agent::AttemptResult Agent::run_attempt(int attempt, int master_port) {
  const int n = spec_.nproc_per_node;
  std::string attempt_dir;
  if (!spec_.log_dir.empty()) {
    attempt_dir = spec_.log_dir + "/" + spec_.run_id + "/attempt_" + std::to_string(attempt);
  }
  std::vector<std::string> base_env = base_environment();
  if (n > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) base_env.push_back("OMP_NUM_THREADS=1");
  const std::vector<std::string> command = spec_.command();

  std::vector<Worker> workers(n);
  AttemptResult result;
  std::optional<Clock::time_point> kill_deadline;

  auto stop_all = [&](int sig) {
    for (auto& w : workers) {
      if (w.running) signal_group(w.pid, sig);
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
      w.rank = spec_.node_rank * n + i;
      WorkerEnv env;
      env.rank = w.rank;
      env.local_rank = i;
      env.group_rank = spec_.node_rank;
      env.role_rank = w.rank;
      env.world_size = n * spec_.nnodes;
      env.local_world_size = n;
      env.group_world_size = spec_.nnodes;
      env.role_world_size = env.world_size;
      env.role_name = spec_.role;
      env.master_addr = spec_.master_addr;
      env.master_port = master_port;
      env.restart_count = attempt;
      env.max_restarts = spec_.max_restarts;
      env.run_id = spec_.run_id;
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
        if (!rank_dir.empty()) target.file_fd = open_log_file(rank_dir + (s == 0 ? "/stdout.log" : "/stderr.log"));
        target.keep_last_lines = s == 1 ? kReportLines : 0;
        w.tees[s] = std::make_unique<StreamTee>(std::move(target));
      }

      SpawnedProcess p = spawn_process(command, worker_env);
      guard_.watch(p.pid);
      w.pid = p.pid;
      w.fds[0] = p.stdout_fd;
      w.fds[1] = p.stderr_fd;
      w.running = true;
      w.outcome.rank = w.rank;
      w.outcome.local_rank = i;
      w.outcome.pid = p.pid;
    }
  } catch (...) {
    stop_all(SIGKILL);
    for (auto& w : workers) {
      if (w.running) waitpid(w.pid, nullptr, 0);
      for (int fd : w.fds) if (fd >= 0) close(fd);
      if (w.pid > 0) guard_.forget(w.pid);
    }
    throw;
  }

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
      // The first failure (not one caused by our own shutdown) ends the attempt.
      if (w.outcome.failed() && !kill_deadline && result.signal == 0) {
        // Read what the rank wrote before it died so the report has its last words.
        for (int s = 0; s < 2; ++s) if (w.fds[s] >= 0) pump(w, s);
        result.first_failure = w.outcome;
        result.failure_stderr = w.tees[1]->last_lines();
        begin_shutdown();
      }
    }
  };

  std::vector<pollfd> pfds;
  std::vector<std::pair<int, int>> owners;  // (worker index, stream) per pollfd after the first
  const int monitor_ms = std::max(1, static_cast<int>(spec_.monitor_interval_s * 1000));
  while (running_count() > 0) {
    pfds.clear();
    owners.clear();
    pfds.push_back({signal_fd_, POLLIN, 0});
    for (int i = 0; i < n; ++i) {
      for (int s = 0; s < 2; ++s) {
        if (workers[i].fds[s] >= 0) {
          pfds.push_back({workers[i].fds[s], POLLIN, 0});
          owners.emplace_back(i, s);
        }
      }
    }
    int timeout_ms = monitor_ms;
    if (kill_deadline) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*kill_deadline - Clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<long>(left, 0, timeout_ms));
    }
    int ready = poll(pfds.data(), pfds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) throw Error(std::string("poll: ") + std::strerror(errno));
    if (ready > 0) {
      for (size_t k = 1; k < pfds.size(); ++k) {
        if (pfds[k].revents != 0) pump(workers[owners[k - 1].first], owners[k - 1].second);
      }
      if (pfds[0].revents & POLLIN) {
        signalfd_siginfo info{};
        while (read(signal_fd_, &info, sizeof(info)) == sizeof(info)) {
          int sig = static_cast<int>(info.ssi_signo);
          if (sig == SIGCHLD) continue;  // reaped below
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
    if (kill_deadline && Clock::now() >= *kill_deadline) stop_all(SIGKILL);
  }

  // Every worker has exited: kill what is left of their process groups (daemonised
  // children), then drain the pipes for a bounded time.
  for (auto& w : workers) signal_group(w.pid, SIGKILL);
  auto drain_deadline = Clock::now() + std::chrono::milliseconds(500);
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
  return result;
}

}  // namespace ddp::launcher
