#pragma once
// Test support: run a real process with its output captured to files, with
// bounded waits (no test can hang).

#include <sys/socket.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace ddp::testing {

struct ProcessResult {
  bool exited = false;  // false: still running when the wait timed out (then killed)
  bool signaled = false;
  int code = -1;  // exit code, or the signal number when signaled
  std::string out, err;
  double seconds = 0;
};

class Subprocess {
 public:
  // Starts argv; `env` entries override/add to the test's environment
  // (a value of "\x01" removes the variable). The child leads a new process
  // group so tests can signal it like a terminal would.
  Subprocess(const std::vector<std::string>& argv,
             const std::map<std::string, std::string>& env = {});
  ~Subprocess();  // kills the process (group) if still running

  pid_t pid() const { return pid_; }
  // Waits up to `timeout`; on timeout kills the process group and returns exited=false.
  ProcessResult wait(std::chrono::milliseconds timeout);
  std::string read_out() const;
  std::string read_err() const;

 private:
  pid_t pid_ = -1;
  std::string dir_;
  bool reaped_ = false;
  std::chrono::steady_clock::time_point start_;
};

// Runs argv to completion (bounded by timeout).
ProcessResult run_process(const std::vector<std::string>& argv,
                          const std::map<std::string, std::string>& env = {},
                          std::chrono::milliseconds timeout = std::chrono::seconds(60));

// True while `pid` exists and is not a zombie.
bool process_alive(pid_t pid);
// Polls until `pred` is true or `timeout` passes; returns pred's last value.
bool wait_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout);

std::string make_temp_dir();
// The run's directory under a --log_dir, in torchrun's layout: the one entry
// named <run_id>_<random> ("" when there is none, or several).
std::string run_dir(const std::string& log_dir, const std::string& run_id);

// A loopback TCP port (AF_INET or AF_INET6) that was free a moment ago, or
// -1 when none can be bound.
int free_port(int family = AF_INET);

// A TCP socket listening on an ephemeral port of every IPv4 address: a port
// in use, as ddprun meets it. Closed on destruction.
class BusyPort {
 public:
  BusyPort();
  ~BusyPort();
  BusyPort(const BusyPort&) = delete;
  BusyPort& operator=(const BusyPort&) = delete;
  int port() const { return port_; }  // 0 when no socket could listen

 private:
  int fd_;
  int port_ = 0;
};

// A TCP connection to 127.0.0.1:`port`, or -1 when refused.
int connect_loopback(int port);
// GET http://127.0.0.1:`port``path` (HTTP/1.0, 5 s read timeout): the body,
// or "" when nothing answered.
std::string http_get(int port, const std::string& path);
std::string read_file(const std::string& path);
// The pids in the files of `dir` whose names start with `prefix` ("" for
// all), skipping NAME.tmp files: test workers write NAME.tmp, then rename it
// to NAME, so only finished files are read.
std::set<pid_t> read_pids(const std::string& dir, const std::string& prefix);
void write_file(const std::string& path, const std::string& text);
// Lines of `text` that start with `prefix` (prefix removed).
std::vector<std::string> lines_with_prefix(const std::string& text, const std::string& prefix);

}  // namespace ddp::testing
