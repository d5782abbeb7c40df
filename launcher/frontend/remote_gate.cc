#include "frontend/remote_gate.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "agent/rpc_plugin.h"
#include "ddp/common/endpoint.h"
#include "ddp/common/error.h"
#include "ddp/common/launcher_log.h"
#include "frontend/host_stream.h"
#include "worker_group/process.h"

namespace ddp::launcher {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> lost_front_end{false};  // RemoteGate::front_end_lost()

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// One line from `fd` (without '\n'), waiting until `deadline`; nullopt at EOF
// or timeout; `*signal` set when a stop signal arrived on `signal_fd` first.
std::optional<std::string> read_line(int fd, int signal_fd, Clock::time_point deadline,
                                     int* signal) {
  std::string line;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return std::nullopt;
    pollfd fds[2] = {{fd, POLLIN, 0}, {signal_fd, POLLIN, 0}};
    if (poll(fds, 2, static_cast<int>(left)) < 0 && errno != EINTR) return std::nullopt;
    if (fds[1].revents & POLLIN) {
      signalfd_siginfo info{};
      while (read(signal_fd, &info, sizeof info) == sizeof info) {
        const int sig = static_cast<int>(info.ssi_signo);
        if (sig != SIGCHLD && sig != SIGUSR1 && sig != SIGUSR2) *signal = sig;
      }
      if (*signal != 0) return std::nullopt;
    }
    if (!(fds[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    char c = 0;
    const ssize_t n = read(fd, &c, 1);  // one byte at a time: nothing after the line is taken
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    if (c == '\n') return line;
    line += c;
  }
}

}  // namespace

int RemoteGate::open(LaunchSpec& spec, double timeout_s, int signal_fd) {
  auto& log = launcher_log();
  control_fd_ = fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3);
  if (control_fd_ < 0) throw Error("--remote_agent: no channel to the front end on stdin");
  const int devnull = ::open("/dev/null", O_RDONLY);
  if (devnull >= 0) {
    dup2(devnull, STDIN_FILENO);
    close(devnull);
  }
  // A host without the rendezvous plugin fails the launch here, before anything starts.
  if (std::string missing = rpc_plugin_missing(); !missing.empty()) throw Error(missing);
  int port = 0;
  if (spec.rdzv_conf.is_host.value_or(false)) {
    port_ = PortReservation::reserve(0, "--rdzv_endpoint");
    port = port_->port();
  }
  write_all(STDOUT_FILENO, ready_line(port));
  // gRPC's libraries load while the front end waits for the slowest host.
  load_rpc_plugin();
  int signal = 0;
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<long>(timeout_s * 1000));
  const auto line = read_line(control_fd_, signal_fd, deadline, &signal);
  if (signal != 0) return 128 + signal;
  const auto go = line ? parse_go(*line) : std::nullopt;
  if (!go) {
    // The front end gave up the launch (another host failed) or went away: nothing ran here.
    log.debug("no go-ahead from the front end; leaving");
    return 1;
  }
  const Endpoint ep = parse_endpoint(go->first, 29400, "the front end's rendezvous endpoint");
  spec.rdzv_endpoint = go->first;
  spec.rdzv_host = ep.host;
  spec.rdzv_port = ep.port;
  spec.rdzv_token = go->second;
  return 0;
}

void RemoteGate::watch() {
  const int fd = control_fd_;
  std::thread([fd] {
    LineBuffer lines;
    char data[256];
    std::string why;
    while (why.empty()) {
      pollfd pfd{fd, POLLIN, 0};
      const int ready = poll(&pfd, 1, static_cast<int>(kFrontEndSilence.count()));
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) {
        why =
            fmt::format("no word from the front end for {} ms (its network cut, or it was stopped)",
                        kFrontEndSilence.count());
        break;
      }
      const ssize_t n = read(fd, data, sizeof data);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) why = "the front end's ssh channel closed (the front end is gone)";
      for (const auto& line : lines.add(data, static_cast<size_t>(std::max<ssize_t>(n, 0)))) {
        if (auto sig = parse_signal(line)) kill(getpid(), *sig);
      }
    }
    launcher_log().warn("{}: stopping this host's workers", why);
    lost_front_end = true;
    kill(getpid(), SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    kill(getpid(), SIGTERM);  // a second request: the agent kills its workers' groups now
  }).detach();
}

bool RemoteGate::front_end_lost() { return lost_front_end; }

}  // namespace ddp::launcher
