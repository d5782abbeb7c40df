#include "frontend/front_end.h"

#include <limits.h>
#include <poll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "cli/job_env.h"
#include "cli/remote_command.h"
#include "ddp/common/endpoint.h"
#include "ddp/common/env_contract.h"
#include "ddp/common/error.h"
#include "ddp/common/flag_file.h"
#include "ddp/common/launcher_log.h"
#include "ddp/common/random_id.h"
#include "frontend/ssh_session.h"
#include "worker_group/process.h"

namespace ddp::launcher {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct Plan {
  std::vector<HostSlots> hosts;
  std::string source;  // the hostfile, or --hosts
  EnvList env;
  std::string workdir, ddprun, run_id, token;
  NodeRange nodes;  // --nnodes: the job goes on while nodes.min hosts remain
};

std::optional<std::string> process_env(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

// ~/.ddp_env, then the working directory's (which wins), where they exist.
std::vector<EnvList> env_files(const std::string& workdir) {
  std::vector<std::string> paths;
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    paths.push_back(std::string(home) + "/.ddp_env");
  if (paths.empty() || paths.front() != workdir + "/.ddp_env")
    paths.push_back(workdir + "/.ddp_env");
  std::vector<EnvList> files;
  for (const auto& path : paths) {
    std::ifstream file(path);
    if (!file) continue;
    std::stringstream text;
    text << file.rdbuf();
    files.push_back(parse_env_file(text.str(), path));
  }
  return files;
}

Plan make_plan(const FrontEndArgs& args) {
  Plan plan;
  if (!args.text.hostfile.empty()) {
    plan.source = args.text.hostfile;
    plan.hosts =
        parse_hostfile(read_flag_file("--hostfile", args.text.hostfile), args.text.hostfile);
  } else {
    plan.source = "--hosts";
    plan.hosts = parse_host_list(args.text.hosts);
  }
  plan.hosts =
      select_hosts(std::move(plan.hosts), args.text.include, args.text.exclude, plan.source);
  plan.nodes = hostfile_node_range(args.nnodes, plan.hosts.size(), plan.source);
  char path[PATH_MAX] = {};
  if (getcwd(path, sizeof path) == nullptr) throw Error("cannot read the working directory");
  plan.workdir = path;
  plan.env = job_environment(env_files(plan.workdir), args.text.env, process_env);
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) throw Error("cannot find ddprun's own executable (/proc/self/exe)");
  plan.ddprun.assign(path, static_cast<size_t>(n));
  plan.run_id = args.run_id.empty() ? "hostfile-" + random_hex(10) : args.run_id;
  plan.token = random_hex(32);
  return plan;
}

std::vector<std::string> host_argv(const FrontEndArgs& args, const Plan& plan, size_t i) {
  RemoteJob job;
  job.workdir = plan.workdir;
  job.env = plan.env;
  const HostSlots& host = plan.hosts[i];
  if (!host.devices.empty()) {
    const auto [name, value] = visible_devices_variable(host.devices);
    set_env(job.env, name, value);
  }
  job.ddprun = plan.ddprun;
  // The agent waits for the go-ahead at most as long as the front end waits for every host.
  job.args = agent_args(args, plan.hosts, i, plan.run_id, args.text.ssh_timeout_s + 10);
  SshSettings ssh;
  ssh.port = args.text.ssh_port;
  ssh.options = split_words(args.text.ssh_opts, "--ssh_opts");
  ssh.timeout_s = args.text.ssh_timeout_s;
  return ssh_argv(host.name, ssh, remote_command(job));
}

// False when the console is gone (EPIPE: its reader exited).
bool write_line(int fd, const std::string& line) {
  const std::string text = line + "\n";
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EPIPE) return false;
    if (n <= 0) return true;  // another error (a full disk): the job goes on
    done += static_cast<size_t>(n);
  }
  return true;
}

int ms_until(Clock::time_point t) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 100));
}

// Why host `s` ended before it was ready, for one line.
std::string launch_failure(const SshSession& s, const std::string& ddprun) {
  const std::string said = s.last_err().empty() ? "" : ": " + s.last_err().back();
  if (s.code() == 255) return "ssh failed (exit code 255)" + said;
  if (s.code() == 127) return "no ddprun at " + ddprun + " there (exit code 127)" + said;
  return "its agent ended with exit code " + std::to_string(s.code()) + said;
}

// Sends every agent a keep-alive line each kAliveInterval from a thread of
// its own (the agents stop their workers when the front end falls silent),
// until destroyed.
class KeepAlive {
 public:
  explicit KeepAlive(std::vector<std::unique_ptr<SshSession>>& sessions)
      : thread_([this, &sessions] {
          std::unique_lock<std::mutex> lock(mutex_);
          while (!done_) {
            for (auto& s : sessions) s->send(alive_line());
            wake_.wait_for(lock, kAliveInterval, [this] { return done_; });
          }
        }) {}
  ~KeepAlive() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }
  KeepAlive(const KeepAlive&) = delete;
  KeepAlive& operator=(const KeepAlive&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;
};

class FrontEnd {
 public:
  FrontEnd(const FrontEndArgs& args, Plan plan, int signal_fd)
      : args_(args), plan_(std::move(plan)), signal_fd_(signal_fd) {
    // Ctrl-Z would stop the front end, and the hosts would take its silence
    // for a lost front end: it is read here instead, and refused.
    sigset_t tstp;
    sigemptyset(&tstp);
    sigaddset(&tstp, SIGTSTP);
    sigprocmask(SIG_BLOCK, &tstp, nullptr);
    tstp_fd_ = signalfd(-1, &tstp, SFD_NONBLOCK | SFD_CLOEXEC);
  }
  ~FrontEnd() {
    if (tstp_fd_ >= 0) close(tstp_fd_);
  }
  FrontEnd(const FrontEnd&) = delete;
  FrontEnd& operator=(const FrontEnd&) = delete;
  int run();

 private:
  int poll_once(int timeout_ms);
  void on_line(size_t h, int stream, const std::string& line);
  int launch();
  int supervise();
  bool one_failed_for_good();
  void send_all(const std::string& line);
  bool all_ended() const;

  const FrontEndArgs& args_;
  Plan plan_;
  int signal_fd_;
  int tstp_fd_ = -1;
  std::vector<std::unique_ptr<SshSession>> sessions_;
  std::vector<bool> ready_;
  bool console_closed_ = false;  // a write to stdout or stderr failed with EPIPE
  std::vector<HostEnd> ends_;
  std::vector<ReportCatcher> reports_;
  std::vector<bool> loss_said_;  // a host the job goes on without was named
  long ended_ = 0, reported_ = 0;
  int rdzv_port_ = 0;
};

// Reads every host's output and the signals once (up to `timeout_ms`);
// returns a stop signal that arrived, or 0.
int FrontEnd::poll_once(int timeout_ms) {
  std::vector<pollfd> fds = {{signal_fd_, POLLIN, 0}, {tstp_fd_, POLLIN, 0}};
  std::vector<std::pair<size_t, int>> owners;
  for (size_t h = 0; h < sessions_.size(); ++h) {
    std::vector<int> streams;
    sessions_[h]->add_fds(fds, streams);
    for (int s : streams) owners.emplace_back(h, s);
  }
  if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR)
    throw Error(std::string("poll: ") + std::strerror(errno));
  int stop = 0;
  if (fds[0].revents & POLLIN) {
    signalfd_siginfo info{};
    while (read(signal_fd_, &info, sizeof info) == sizeof info) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGUSR1 || sig == SIGUSR2) {
        // A notice for the program (a preemption warning): every host's workers get it.
        launcher_log().info("forwarding {} to every host's workers", signal_name(sig));
        send_all(signal_line(sig));
      } else if (sig != SIGCHLD && stop == 0) {
        stop = sig;
      }
    }
  }
  if (fds[1].revents & POLLIN) {
    signalfd_siginfo info{};
    while (read(tstp_fd_, &info, sizeof info) == sizeof info) {
    }
    launcher_log().warn(
        "Ctrl-Z ignored: the hosts would stop their workers after {} ms without the front end "
        "(Ctrl-C stops the job)",
        kFrontEndSilence.count());
  }
  for (size_t k = 2; k < fds.size(); ++k) {
    if (fds[k].revents == 0) continue;
    const auto [h, stream] = owners[k - 2];
    for (const auto& line : sessions_[h]->pump(stream)) on_line(h, stream, line);
  }
  for (size_t h = 0; h < sessions_.size(); ++h) {
    if (ends_[h].ended_at < 0 && sessions_[h]->reap()) {
      ends_[h].code = sessions_[h]->code();
      ends_[h].ended_at = ended_++;
    }
  }
  return stop;
}

void FrontEnd::on_line(size_t h, int stream, const std::string& line) {
  if (stream == 1 && !ready_[h]) {
    if (auto port = parse_ready(line)) {
      ready_[h] = true;
      if (h == 0) rdzv_port_ = *port;
      return;
    }
  }
  if (stream == 2 && reports_[h].add(line)) {
    ends_[h].reported_at = reported_++;
    ends_[h].report = reports_[h].report();
  } else if (stream == 2 && ends_[h].reported_at >= 0) {
    ends_[h].report = reports_[h].report();
  }
  if (!console_closed_ && !write_line(stream == 1 ? STDOUT_FILENO : STDERR_FILENO,
                                      label_line(line, plan_.hosts[h].name))) {
    console_closed_ = true;
  }
}

bool FrontEnd::all_ended() const {
  return std::all_of(ends_.begin(), ends_.end(), [](const HostEnd& e) { return e.ended_at >= 0; });
}

void FrontEnd::send_all(const std::string& line) {
  for (auto& s : sessions_) s->send(line);
}

// Until every host is ready: 0, else the launch failed (every host is gone
// again, none was told to go) and the exit code.
int FrontEnd::launch() {
  auto& log = launcher_log();
  const auto started = Clock::now();
  const auto deadline =
      started + std::chrono::milliseconds(static_cast<long>(args_.text.ssh_timeout_s * 1000));
  int signal = 0;
  for (;;) {
    if (std::all_of(ready_.begin(), ready_.end(), [](bool r) { return r; })) {
      log.info("every host answered over ssh in {:.2f} s; starting the workers",
               std::chrono::duration<double>(Clock::now() - started).count());
      return 0;
    }
    // Every host answers (ready, or failed) before the launch is given up, so
    // that every bad host is named at once; the deadline bounds it.
    bool answered = true, one_failed = false;
    for (size_t h = 0; h < sessions_.size(); ++h) {
      answered = answered && (ready_[h] || sessions_[h]->ended());
      one_failed = one_failed || (!ready_[h] && sessions_[h]->ended());
    }
    if (signal != 0 || Clock::now() >= deadline || (answered && one_failed)) break;
    signal = poll_once(ms_until(deadline));
  }
  // Nothing started anywhere: the ready agents are told to leave (EOF), the others are killed.
  const bool late = signal == 0 && Clock::now() >= deadline;
  std::vector<bool> silent(sessions_.size());
  for (size_t h = 0; h < sessions_.size(); ++h) {
    silent[h] = !ready_[h] && !sessions_[h]->ended();
    sessions_[h]->close_input();
    if (silent[h]) sessions_[h]->kill();
  }
  const auto grace = Clock::now() + 2s;
  while (!all_ended() && Clock::now() < grace) poll_once(ms_until(grace));
  for (auto& s : sessions_) s->kill();
  while (!all_ended()) poll_once(100);
  if (signal != 0) {
    log.warn("received {} while starting the hosts; none was started", signal_name(signal));
    return 128 + signal;
  }
  int code = 255;
  for (size_t h = 0; h < sessions_.size(); ++h) {
    if (ready_[h] || (silent[h] && !late)) continue;
    const auto& s = *sessions_[h];
    log.error("error: host {}: {}", plan_.hosts[h].name,
              silent[h] ? fmt::format("no answer over ssh within --ssh_timeout={:g} s",
                                      args_.text.ssh_timeout_s)
                        : launch_failure(s, plan_.ddprun));
    if (!silent[h] && s.code() != 255 && code == 255) code = s.code();
  }
  log.error("error: the launch failed before any worker started; no host runs anything");
  return code;
}

int FrontEnd::supervise() {
  auto& log = launcher_log();
  const std::string endpoint =
      Endpoint{host_address(plan_.hosts.front().name), rdzv_port_}.to_string();
  send_all(go_line(endpoint, plan_.token));
  const auto grace = std::chrono::milliseconds(static_cast<long>(args_.shutdown_timeout_s * 1000));
  int signal = 0;
  std::optional<Clock::time_point> stop_at, kill_at;
  KeepAlive keep_alive(sessions_);  // on its own thread: a console that blocks us is no silence
  while (!all_ended()) {
    Clock::time_point wake = Clock::now() + 100ms;
    for (const auto& t : {stop_at, kill_at})
      if (t) wake = std::min(wake, *t);
    const int sig = poll_once(ms_until(wake));
    if (sig == 0 && console_closed_ && signal == 0) {
      // As a local job: the lines have nowhere to go (see docs/cli.md).
      signal = SIGPIPE;
      log.warn(
          "the console was closed (the reader of ddprun's output exited): stopping the workers on "
          "every host");
      send_all(signal_line(SIGTERM));
      stop_at.reset();
      kill_at = Clock::now() + grace + 15s;
    } else if (sig != 0 && signal == 0) {
      signal = sig;
      log.warn("received {}: stopping the workers on every host", signal_name(sig));
      send_all(signal_line(sig));
      stop_at.reset();
      kill_at = Clock::now() + grace + 15s;
    } else if (sig != 0) {
      log.warn("received {} again: stopping every host now", signal_name(sig));
      for (auto& s : sessions_) s->close_input();  // each agent kills its workers at once
      kill_at = Clock::now() + 5s;
    }
    // The others hear of a failure through the rendezvous; this is the fallback.
    if (signal == 0 && !stop_at && !kill_at && one_failed_for_good())
      stop_at = Clock::now() + grace + 30s;
    if (stop_at && Clock::now() >= *stop_at) {
      log.warn("hosts still running {} s after one failed: stopping them",
               std::chrono::duration_cast<std::chrono::seconds>(grace + 30s).count());
      send_all(signal_line(SIGTERM));
      stop_at.reset();
      kill_at = Clock::now() + grace + 15s;
    }
    if (kill_at && Clock::now() >= *kill_at) {
      for (auto& s : sessions_) s->kill();
      kill_at.reset();
    }
  }
  Verdict verdict = decide(ends_, signal, static_cast<size_t>(plan_.nodes.min));
  for (const auto& line : verdict.summary) {
    if (verdict.code == 0) {
      log.warn("{}", line);
    } else {
      log.error("{}", line);
    }
  }
  return verdict.code;
}

// Whether a host ended non-zero and the job cannot go on without it. With
// --nnodes=MIN:N the rendezvous leaves a lost host out while MIN remain
// (scale-down, or a heal at node scale): the others are not stopped, and
// the host is named once. The first host hosts the rendezvous: nothing goes
// on without it.
bool FrontEnd::one_failed_for_good() {
  const bool one_failed = std::any_of(
      ends_.begin(), ends_.end(), [](const HostEnd& e) { return e.ended_at >= 0 && e.code != 0; });
  if (!one_failed) return false;
  const auto min = static_cast<size_t>(plan_.nodes.min);
  const bool rendezvous_lost = ends_[0].ended_at >= 0 && ends_[0].code != 0;
  if (min >= ends_.size() || rendezvous_lost || !job_can_go_on(ends_, min)) return true;
  for (size_t h = 0; h < ends_.size(); ++h) {
    if (ends_[h].ended_at < 0 || ends_[h].code == 0 || loss_said_[h]) continue;
    loss_said_[h] = true;
    launcher_log().warn("{}; the other hosts go on while at least {} of {} remain (--nnodes={}:{})",
                        how_host_ended(ends_[h]), min, ends_.size(), min, ends_.size());
  }
  return false;
}

int FrontEnd::run() {
  std::string list;
  int workers = 0;
  for (const auto& h : plan_.hosts) {
    list += (list.empty() ? "" : ", ") + h.name + " (" + std::to_string(h.workers()) + ")";
    workers += h.workers();
  }
  launcher_log().info("run {}: {} worker(s) on {} host(s) over ssh: {}; the rendezvous on {}",
                      plan_.run_id, workers, plan_.hosts.size(), list, plan_.hosts.front().name);
  ready_.assign(plan_.hosts.size(), false);
  ends_.resize(plan_.hosts.size());
  reports_.resize(plan_.hosts.size());
  loss_said_.assign(plan_.hosts.size(), false);
  for (size_t h = 0; h < plan_.hosts.size(); ++h) {
    ends_[h].host = plan_.hosts[h].name;
    sessions_.push_back(
        std::make_unique<SshSession>(plan_.hosts[h].name, host_argv(args_, plan_, h)));
  }
  if (int code = launch(); code != 0) return code;
  return supervise();
}

}  // namespace

int run_front_end(const FrontEndArgs& args, int signal_fd) {
  Plan plan = make_plan(args);  // bad input throws here, before anything starts
  std::vector<std::vector<std::string>> argvs;
  for (size_t h = 0; h < plan.hosts.size(); ++h) argvs.push_back(host_argv(args, plan, h));
  FrontEnd front(args, std::move(plan), signal_fd);
  return front.run();
}

}  // namespace ddp::launcher
