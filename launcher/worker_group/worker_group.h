#pragma once
// One attempt's worker processes: spawned with their environment and output
// routing, their pipes pumped into the log tees, reaped, signalled, stopped
// (the stop signal with SIGCONT, then SIGKILL after the grace period) and
// drained once they are gone. Not thread-safe: driven by the agent's event
// loop, on the thread that spawned the workers (their parent-death signal
// follows that thread).

#include <poll.h>
#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "worker_group/failure_report.h"
#include "worker_group/log_tee.h"
#include "worker_group/orphan_guard.h"
#include "worker_group/process.h"

namespace ddp::launcher {

// What one worker is started with.
struct WorkerLaunch {
  int rank = 0;  // global rank
  int local_rank = 0;
  std::vector<std::string> env;  // "NAME=value", the whole environment
  std::vector<int> cpus;         // its affinity mask; empty: inherited
  TeeTarget streams[2];          // where its stdout and stderr go
  StdioChoice stdio;             // its stdin, and whether its streams are terminals
};

struct Worker {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;         // also its process group
  int fds[2] = {-1, -1};  // stdout, stderr read ends; -1 once at EOF
  std::unique_ptr<StreamTee> tees[2];
  bool running = false;
  WorkerOutcome outcome;  // how it ended, once !running
};

class WorkerGroup {
 public:
  using Clock = std::chrono::steady_clock;

  // Spawns every worker in order (`inherit_fd`: kept open in each, -1 for
  // none; `host`: for the outcomes, empty on a single node). When one cannot
  // be started, those already started are killed and reaped and the error
  // (ddp::Error) is rethrown.
  WorkerGroup(const std::vector<std::string>& command, std::vector<WorkerLaunch> launches,
              OrphanGuard& guard, int inherit_fd, const std::string& host);
  ~WorkerGroup();  // kills and reaps whatever still runs, closes the pipes
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  size_t size() const { return workers_.size(); }
  Worker& operator[](size_t i) { return workers_[i]; }
  const Worker& operator[](size_t i) const { return workers_[i]; }
  int running() const;
  // Whether writing a worker's line to ddprun's stdout or stderr failed
  // with EPIPE (the reader of the pipe exited).
  bool console_closed() const;

  // Appends the open pipes to `fds`, and (worker, stream) for each to `owners`.
  void add_pipes(std::vector<pollfd>& fds, std::vector<std::pair<size_t, int>>& owners) const;
  // Reads what the worker's stream has now (closing it at EOF).
  void pump(size_t worker, int stream);
  void pump_all(size_t worker);  // both streams: a dead rank's last words

  // Reaps the workers that ended; returns their indexes.
  std::vector<size_t> reap();

  // Starts worker `i`, which has ended, again (--on_failure=heal) with
  // `launch`'s environment, CPUs and stdio (its streams are ignored): the
  // output goes on through the worker's tees (console prefix, log files
  // appended, kept stderr lines). What is left of the previous process's
  // group is killed and its pipes read and closed first. Throws ddp::Error
  // when the process cannot be started (the worker then stays ended).
  void relaunch(size_t i, const WorkerLaunch& launch);

  // `sig` to every running worker's process group, with SIGCONT unless it is
  // SIGKILL: a stopped worker (SIGSTOP, Ctrl-Z, a debugger let go) could not
  // act on it before the grace period ends.
  void signal_groups(int sig);
  // `sig` to each running worker itself, not its group (notices such as
  // SIGUSR1, which children that do not expect them would die of); returns
  // how many were told.
  int signal_workers(int sig);
  // Stops the group: `sig` now (as signal_groups), SIGKILL once `grace` has
  // passed (enforced by kill_if_overdue). Returns false, doing nothing, when
  // a stop is already under way.
  bool stop(int sig, std::chrono::duration<double> grace);
  bool stopping() const { return kill_deadline_.has_value(); }
  std::optional<Clock::time_point> kill_deadline() const { return kill_deadline_; }
  void kill_if_overdue();

  // Once no worker runs: kills what is left of their process groups
  // (daemonised children) and what ddprun adopted as their subreaper
  // (daemons that left the groups: setsid and a double fork), then drains the pipes until they end
  // or stay silent for 500 ms (a writer that escaped the group), 10 s at most (time spent waiting
  // for a slow console does not count).
  void drain();

 private:
  void stop_adopted();  // kills and reaps the workers' descendants ddprun adopted
  void release();       // kill, reap, close: the destructor and a failed spawn
  // Closes a reaped worker's pipes (its tees end their last line) and
  // forgets its pid.
  void close_streams(Worker& w);
  void start(size_t i, const WorkerLaunch& launch);  // spawns worker i's process
  OrphanGuard& guard_;
  std::vector<std::string> command_;
  int inherit_fd_;
  std::string host_;
  std::vector<Worker> workers_;
  std::optional<Clock::time_point> kill_deadline_;
};

}  // namespace ddp::launcher
