#include "frontend/ssh_session.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ddp/common/error.h"
#include "worker_group/process.h"

extern char** environ;

namespace ddp::launcher {
namespace {

constexpr size_t kKeptErrLines = 5;

}  // namespace

SshSession::SshSession(std::string host, const std::vector<std::string>& argv)
    : host_(std::move(host)) {
  int in[2];
  if (pipe2(in, O_CLOEXEC) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  StdioChoice stdio;
  stdio.stdin_fd = in[0];
  SpawnedProcess p;
  try {
    p = spawn_process(argv, env, {}, -1, stdio);
  } catch (...) {
    close(in[0]);
    close(in[1]);
    throw;
  }
  close(in[0]);
  pid_ = p.pid;
  stdin_fd_ = in[1];
  // Never blocks the front end: a line for an ssh that cannot send is dropped.
  fcntl(stdin_fd_, F_SETFL, O_NONBLOCK);
  out_fd_[0] = p.stdout_fd;
  out_fd_[1] = p.stderr_fd;
}

SshSession::~SshSession() {
  if (!ended_ && pid_ > 0) {
    signal_group(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  close_input();
  for (int& fd : out_fd_) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
}

void SshSession::add_fds(std::vector<pollfd>& fds, std::vector<int>& streams) const {
  for (int s = 0; s < 2; ++s) {
    if (out_fd_[s] < 0) continue;
    fds.push_back({out_fd_[s], POLLIN, 0});
    streams.push_back(s + 1);
  }
}

std::vector<std::string> SshSession::pump(int stream) {
  const int s = stream - 1;
  std::vector<std::string> lines;
  if (out_fd_[s] < 0) return lines;
  char buf[65536];
  for (;;) {
    const ssize_t n = read(out_fd_[s], buf, sizeof buf);
    if (n > 0) {
      auto more = buffer_[s].add(buf, static_cast<size_t>(n));
      lines.insert(lines.end(), more.begin(), more.end());
      if (static_cast<size_t>(n) < sizeof buf) break;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (auto rest = buffer_[s].finish()) lines.push_back(*rest);  // EOF (or an error)
    close(out_fd_[s]);
    out_fd_[s] = -1;
    break;
  }
  if (s == 1) {
    for (const auto& line : lines) {
      last_err_.push_back(line);
      if (last_err_.size() > kKeptErrLines) last_err_.erase(last_err_.begin());
    }
  }
  return lines;
}

void SshSession::send(const std::string& line) {
  std::lock_guard<std::mutex> lock(input_mutex_);
  if (stdin_fd_ < 0) return;
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = write(stdin_fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // ssh is gone (EPIPE; SIGPIPE is ignored)
    done += static_cast<size_t>(n);
  }
}

void SshSession::close_input() {
  std::lock_guard<std::mutex> lock(input_mutex_);
  if (stdin_fd_ >= 0) close(stdin_fd_);
  stdin_fd_ = -1;
}

bool SshSession::reap() {
  if (ended_) return true;
  if (out_fd_[0] >= 0 || out_fd_[1] >= 0) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r != pid_) return false;
  ended_ = true;
  code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  close_input();
  return true;
}

void SshSession::kill() {
  if (!ended_ && pid_ > 0) signal_group(pid_, SIGKILL);
}

}  // namespace ddp::launcher
