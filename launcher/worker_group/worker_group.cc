#include "worker_group/worker_group.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "ddp/common/launcher_log.h"
#include "worker_group/process.h"
#include "worker_group/process_probe.h"

namespace ddp::launcher {

WorkerGroup::WorkerGroup(const std::vector<std::string>& command,
                         std::vector<WorkerLaunch> launches, OrphanGuard& guard, int inherit_fd,
                         const std::string& host)
    : guard_(guard),
      command_(command),
      inherit_fd_(inherit_fd),
      host_(host),
      workers_(launches.size()) {
  // Every tee first: they own the log files, which are closed with them
  // however far the spawning gets.
  for (size_t i = 0; i < launches.size(); ++i) {
    for (int s = 0; s < 2; ++s)
      workers_[i].tees[s] = std::make_unique<StreamTee>(std::move(launches[i].streams[s]));
  }
  try {
    for (size_t i = 0; i < launches.size(); ++i) start(i, launches[i]);
  } catch (...) {
    release();
    throw;
  }
}

void WorkerGroup::start(size_t i, const WorkerLaunch& launch) {
  Worker& w = workers_[i];
  w.rank = launch.rank;
  w.local_rank = launch.local_rank;
  // The guard's tag first (an outer ddprun's kept in it), so that it can
  // find what this worker leaves behind if ddprun itself is killed.
  const std::string tag_prefix = std::string(OrphanGuard::kTagVariable) + "=";
  std::vector<std::string> env = {guard_.tag_entry(launch.env)};
  for (const auto& entry : launch.env) {
    if (entry.rfind(tag_prefix, 0) != 0) env.push_back(entry);
  }
  SpawnedProcess p = spawn_process(command_, env, launch.cpus, inherit_fd_, launch.stdio);
  guard_.watch(p.pid);
  w.pid = p.pid;
  w.fds[0] = p.stdout_fd;
  w.fds[1] = p.stderr_fd;
  w.running = true;
  w.outcome = WorkerOutcome{};
  w.outcome.rank = w.rank;
  w.outcome.local_rank = w.local_rank;
  w.outcome.pid = p.pid;
  w.outcome.host = host_;
}

void WorkerGroup::relaunch(size_t i, const WorkerLaunch& launch) {
  Worker& w = workers_[i];
  if (w.running) return;
  // The previous process is gone (reaped); its children die with its group,
  // and what they wrote so far still reaches the tees, whose last line is
  // ended before the new process writes.
  signal_group(w.pid, SIGKILL);
  pump_all(i);
  close_streams(w);  // the outcome keeps the pid until the new process starts
  start(i, launch);
}

WorkerGroup::~WorkerGroup() { release(); }

void WorkerGroup::release() {
  signal_groups(SIGKILL);
  for (auto& w : workers_) {
    if (w.running) waitpid(w.pid, nullptr, 0);
    w.running = false;
    for (int s = 0; s < 2; ++s) {
      if (w.fds[s] < 0) continue;
      close(w.fds[s]);
      w.fds[s] = -1;
      if (w.tees[s]) w.tees[s]->flush();
    }
    if (w.pid > 0) guard_.forget(w.pid);
    w.pid = -1;
  }
}

int WorkerGroup::running() const {
  return static_cast<int>(
      std::count_if(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; }));
}

void WorkerGroup::add_pipes(std::vector<pollfd>& fds,
                            std::vector<std::pair<size_t, int>>& owners) const {
  for (size_t i = 0; i < workers_.size(); ++i) {
    for (int s = 0; s < 2; ++s) {
      if (workers_[i].fds[s] < 0) continue;
      fds.push_back({workers_[i].fds[s], POLLIN, 0});
      owners.emplace_back(i, s);
    }
  }
}

void WorkerGroup::pump(size_t worker, int stream) {
  Worker& w = workers_[worker];
  char buf[65536];
  while (w.fds[stream] >= 0) {
    ssize_t got = read(w.fds[stream], buf, sizeof(buf));
    if (got > 0) {
      w.tees[stream]->write(buf, static_cast<size_t>(got));
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && errno == EAGAIN) return;
    close(w.fds[stream]);  // EOF or error
    w.fds[stream] = -1;
    w.tees[stream]->flush();
  }
}

void WorkerGroup::pump_all(size_t worker) {
  for (int s = 0; s < 2; ++s) pump(worker, s);
}

std::vector<size_t> WorkerGroup::reap() {
  std::vector<size_t> ended;
  for (size_t i = 0; i < workers_.size(); ++i) {
    Worker& w = workers_[i];
    if (!w.running) continue;
    int status = 0;
    if (waitpid(w.pid, &status, WNOHANG) != w.pid) continue;
    w.running = false;
    w.outcome.signaled = WIFSIGNALED(status);
    w.outcome.code = w.outcome.signaled ? WTERMSIG(status) : WEXITSTATUS(status);
    ended.push_back(i);
  }
  return ended;
}

void WorkerGroup::signal_groups(int sig) {
  for (auto& w : workers_) {
    if (!w.running) continue;
    signal_group(w.pid, sig);
    if (sig != SIGKILL) signal_group(w.pid, SIGCONT);
  }
}

int WorkerGroup::signal_workers(int sig) {
  int told = 0;
  for (auto& w : workers_) {
    if (w.running && kill(w.pid, sig) == 0) ++told;
  }
  return told;
}

bool WorkerGroup::stop(int sig, std::chrono::duration<double> grace) {
  if (kill_deadline_) return false;
  signal_groups(sig);
  kill_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(grace);
  return true;
}

bool WorkerGroup::console_closed() const {
  return std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) {
    return (w.tees[0] && w.tees[0]->console_closed()) || (w.tees[1] && w.tees[1]->console_closed());
  });
}

void WorkerGroup::kill_if_overdue() {
  if (kill_deadline_ && Clock::now() >= *kill_deadline_) signal_groups(SIGKILL);
}

void WorkerGroup::drain() {
  for (auto& w : workers_) signal_group(w.pid, SIGKILL);
  stop_adopted();
  auto quiet_until = Clock::now() + std::chrono::milliseconds(500);
  const auto cap = Clock::now() + std::chrono::seconds(10);
  std::vector<pollfd> fds;
  std::vector<std::pair<size_t, int>> owners;
  for (;;) {
    fds.clear();
    owners.clear();
    add_pipes(fds, owners);
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(quiet_until - Clock::now()).count();
    if (fds.empty() || left <= 0) break;
    if (poll(fds.data(), fds.size(), static_cast<int>(left)) <= 0) continue;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents != 0) pump(owners[k].first, owners[k].second);
    }
    quiet_until = std::min(cap, Clock::now() + std::chrono::milliseconds(500));
  }
  for (auto& w : workers_) close_streams(w);  // the outcomes keep the pids
}

void WorkerGroup::close_streams(Worker& w) {
  for (int s = 0; s < 2; ++s) {
    if (w.fds[s] < 0) continue;
    close(w.fds[s]);
    w.fds[s] = -1;
    w.tees[s]->flush();
  }
  if (w.pid > 0) guard_.forget(w.pid);
  w.pid = -1;
}

void WorkerGroup::stop_adopted() {
  // What the workers started and left behind, outside their process groups
  // (setsid and a double fork), was adopted by ddprun, the subreaper: it
  // ends with the group, as the group's own processes do.
  const std::vector<pid_t> adopted = adopted_children({guard_.pid()});
  if (adopted.empty()) return;
  for (pid_t pid : adopted) {
    kill(pid, SIGKILL);
    signal_group(pid, SIGKILL);  // and its own group, if it leads one
  }
  for (pid_t pid : adopted) {
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  launcher_log().info("stopped {} process(es) the workers left outside their process groups",
                      adopted.size());
}

}  // namespace ddp::launcher
