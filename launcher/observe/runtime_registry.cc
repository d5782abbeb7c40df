#include "observe/runtime_registry.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ddp/common/launcher_log.h"

namespace ddp::launcher {

std::string runtime_dir() {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  if (xdg != nullptr && *xdg != '\0') return std::string(xdg) + "/ddprun";
  return "/tmp/ddprun-" + std::to_string(getuid());
}

std::string format_entry(const RuntimeEntry& e) {
  return "pid=" + std::to_string(e.pid) + "\nrun_id=" + e.run_id + "\nendpoint=" + e.endpoint +
         "\ntoken=" + e.token + "\ntls_ca=" + e.tls_ca + "\n";
}

std::optional<RuntimeEntry> parse_entry(const std::string& text) {
  RuntimeEntry e;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    if (key == "pid") e.pid = static_cast<pid_t>(std::atol(value.c_str()));
    if (key == "run_id") e.run_id = value;
    if (key == "endpoint") e.endpoint = value;
    if (key == "token") e.token = value;
    if (key == "tls_ca") e.tls_ca = value;
  }
  if (e.pid <= 0 || e.endpoint.empty()) return std::nullopt;
  return e;
}

namespace {

// Makes the directory 0700; false when it cannot be, or is another user's.
bool ensure_private_dir(const std::string& dir) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return false;
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid()) return false;
  return (st.st_mode & 077) == 0 || chmod(dir.c_str(), 0700) == 0;
}

// Whether `pid` is a live ddprun (not a reused pid).
bool is_live_ddprun(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name.rfind("ddprun", 0) == 0;
}

}  // namespace

RuntimeRegistration::RuntimeRegistration(const RuntimeEntry& entry) {
  const std::string dir = runtime_dir();
  if (dir.empty() || !ensure_private_dir(dir)) {
    launcher_log().debug("no runtime directory {}: ddprun status will not list this job", dir);
    return;
  }
  const std::string path = dir + "/" + std::to_string(getpid()) + ".job";
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return;
  const std::string text = format_entry(entry);
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return;
  }
  path_ = path;
}

RuntimeRegistration::~RuntimeRegistration() {
  if (!path_.empty()) ::unlink(path_.c_str());
}

std::vector<RuntimeEntry> list_runtime_entries() {
  std::vector<RuntimeEntry> out;
  std::error_code ec;
  for (const auto& item : std::filesystem::directory_iterator(runtime_dir(), ec)) {
    if (item.path().extension() != ".job") continue;
    std::ifstream in(item.path());
    std::stringstream text;
    text << in.rdbuf();
    auto entry = parse_entry(text.str());
    if (!entry) continue;
    if (!is_live_ddprun(entry->pid)) {
      std::filesystem::remove(item.path(), ec);  // left by a ddprun that was killed
      continue;
    }
    out.push_back(*entry);
  }
  std::sort(out.begin(), out.end(),
            [](const RuntimeEntry& a, const RuntimeEntry& b) { return a.pid < b.pid; });
  return out;
}

}  // namespace ddp::launcher
