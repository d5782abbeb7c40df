#include "worker_group/process_probe.h"

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "ddp/common/error.h"
#include "ddp/common/executables.h"
#include "worker_group/process.h"

extern char** environ;

namespace ddp::launcher {
namespace {

using Clock = std::chrono::steady_clock;

struct Stat {
  pid_t ppid = 0;
  pid_t pgrp = 0;
  char state = '?';
  std::uint64_t ticks = 0;  // utime + stime + cutime + cstime
};

bool read_stat(const std::string& pid, Stat& out) {
  std::ifstream in("/proc/" + pid + "/stat");
  std::string text;
  if (!std::getline(in, text)) return false;
  // "pid (comm) state ppid pgrp ..."; comm may hold spaces and parentheses.
  auto close = text.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream fields(text.substr(close + 2));
  std::string f[15];
  for (auto& field : f) {
    if (!(fields >> field)) return false;
  }
  // After the state: ppid pgrp session tty tpgid flags minflt cminflt majflt
  // cmajflt utime stime cutime cstime (fields 4-17 of proc(5)).
  out.state = f[0][0];
  out.ppid = static_cast<pid_t>(std::atol(f[1].c_str()));
  out.pgrp = static_cast<pid_t>(std::atol(f[2].c_str()));
  out.ticks = std::strtoull(f[11].c_str(), nullptr, 10) +
              std::strtoull(f[12].c_str(), nullptr, 10) +
              std::strtoull(f[13].c_str(), nullptr, 10) + std::strtoull(f[14].c_str(), nullptr, 10);
  return true;
}

// The non-empty lines of `text`, without gdb's remarks about itself.
std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line.rfind("[Thread debugging", 0) == 0 ||
        line.rfind("Using host libthread_db", 0) == 0 || line.rfind("[Inferior ", 0) == 0) {
      continue;
    }
    lines.push_back(line);
  }
  return lines;
}

}  // namespace

std::vector<GroupUsage> process_group_usage(const std::vector<pid_t>& pgids) {
  std::vector<GroupUsage> usage(pgids.size());
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return usage;
  while (dirent* e = readdir(proc)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    Stat st;
    if (!read_stat(e->d_name, st)) continue;
    auto it = std::find(pgids.begin(), pgids.end(), st.pgrp);
    if (it == pgids.end()) continue;
    GroupUsage& u = usage[static_cast<size_t>(it - pgids.begin())];
    u.cpu_ticks += st.ticks;
    if (std::atol(e->d_name) == st.pgrp) u.leader_stopped = st.state == 'T' || st.state == 't';
  }
  closedir(proc);
  return usage;
}

std::vector<pid_t> adopted_children(const std::vector<pid_t>& known) {
  std::vector<pid_t> found;
  const pid_t self = getpid();
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return found;
  while (dirent* e = readdir(proc)) {
    Stat st;
    if (e->d_name[0] < '0' || e->d_name[0] > '9' || !read_stat(e->d_name, st) || st.ppid != self)
      continue;
    const pid_t pid = static_cast<pid_t>(std::atol(e->d_name));
    if (std::find(known.begin(), known.end(), pid) == known.end()) found.push_back(pid);
  }
  closedir(proc);
  return found;
}

std::vector<std::string> native_stacks(pid_t pid, std::chrono::milliseconds timeout) {
  std::vector<std::string> argv;
  if (!find_on_path("eu-stack").empty()) {
    argv = {"eu-stack", "-p", std::to_string(pid)};
  } else if (!find_on_path("gdb").empty()) {
    argv = {"gdb", "-batch", "-nx", "-p", std::to_string(pid), "-ex", "thread apply all bt"};
  } else {
    return {"(no stacks: neither eu-stack (Debian's elfutils) nor gdb is installed)"};
  }
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  SpawnedProcess tool;
  try {
    tool = spawn_process(argv, env);
  } catch (const Error& e) {
    return {"(no stacks: " + argv[0] + ": " + e.what() + ")"};
  }
  std::string out, err;
  const auto deadline = Clock::now() + timeout;
  int fds[2] = {tool.stdout_fd, tool.stderr_fd};
  bool cut = false;
  while (fds[0] >= 0 || fds[1] >= 0) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0 || stop_signal_pending()) {
      cut = true;
      break;
    }
    pollfd pfds[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
    // Short steps, so a pending request to stop is seen at once.
    if (poll(pfds, 2, static_cast<int>(std::min<long long>(left, 50))) <= 0) continue;
    for (int s = 0; s < 2; ++s) {
      if (fds[s] < 0 || pfds[s].revents == 0) continue;
      char buf[4096];
      ssize_t n = read(fds[s], buf, sizeof buf);
      if (n > 0) {
        (s == 0 ? out : err).append(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        close(fds[s]);
        fds[s] = -1;
      }
    }
  }
  for (int fd : fds) {
    if (fd >= 0) close(fd);
  }
  signal_group(tool.pid, SIGKILL);  // a tool stuck attaching, or one that is done
  int status = 0;
  waitpid(tool.pid, &status, 0);
  std::vector<std::string> lines = split_lines(out);
  if (cut)
    lines.push_back("(" + argv[0] + " cut off after " + std::to_string(timeout.count()) + " ms)");
  if (lines.empty()) {
    auto why = split_lines(err);
    return {"(no stacks: " + argv[0] + " printed nothing" +
            (why.empty() ? "" : ": " + why.front()) + ")"};
  }
  return lines;
}

}  // namespace ddp::launcher
