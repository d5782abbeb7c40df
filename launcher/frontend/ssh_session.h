#pragma once
// One host of a `ddprun --hostfile` job, seen from the front end: the ssh
// client running that host's ddprun agent. Its stdin carries the front end's
// protocol lines (host_stream.h) and, by closing, tells the agent that the
// front end is gone; its stdout and stderr come back as whole lines. The ssh
// client leads its own process group (a Ctrl-C at the terminal reaches the
// front end only, which stops the hosts in order) and dies with the front end
// (PR_SET_PDEATHSIG), so a SIGKILLed front end closes every channel.

#include <poll.h>
#include <sys/types.h>

#include <mutex>
#include <string>
#include <vector>

#include "frontend/host_stream.h"

namespace ddp::launcher {

class SshSession {
 public:
  // Starts `argv` (ssh ...) with the front end's environment. Throws ddp::Error.
  SshSession(std::string host, const std::vector<std::string>& argv);
  ~SshSession();  // SIGKILLs ssh if it still runs
  SshSession(const SshSession&) = delete;
  SshSession& operator=(const SshSession&) = delete;

  const std::string& host() const { return host_; }
  // Adds the open output pipes (tagged stream 1 or 2 in `streams`).
  void add_fds(std::vector<pollfd>& fds, std::vector<int>& streams) const;
  // Reads what `stream` (1 stdout, 2 stderr) has; whole lines, and at EOF the rest.
  std::vector<std::string> pump(int stream);
  // Writes a protocol line to the agent (ignored once the input is closed or
  // ssh is gone). send() and close_input() may be called from two threads.
  void send(const std::string& line);
  void close_input();
  // Reaps ssh once both outputs are at EOF; true once it has ended.
  bool reap();
  bool ended() const { return ended_; }
  int code() const { return code_; }  // exit code, or 128 + signal
  void kill();                        // SIGKILL to ssh's process group
  // The last lines ssh or the agent wrote to stderr (for a failed launch).
  const std::vector<std::string>& last_err() const { return last_err_; }

 private:
  std::string host_;
  pid_t pid_ = -1;
  std::mutex input_mutex_;  // guards stdin_fd_
  int stdin_fd_ = -1;
  int out_fd_[2] = {-1, -1};  // stdout, stderr
  LineBuffer buffer_[2];
  std::vector<std::string> last_err_;
  bool ended_ = false;
  int code_ = -1;
};

}  // namespace ddp::launcher
