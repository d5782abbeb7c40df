#include "subprocess.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace ddp::testing {

std::string make_temp_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/ddptest-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) std::abort();
  return buf.data();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::set<pid_t> read_pids(const std::string& dir, const std::string& prefix) {
  std::set<pid_t> pids;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    auto name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && name.find(".tmp") == std::string::npos) {
      pids.insert(std::stoi(read_file(entry.path())));
    }
  }
  return pids;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::vector<std::string> lines_with_prefix(const std::string& text, const std::string& prefix) {
  std::vector<std::string> lines;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) {
    if (line.rfind(prefix, 0) == 0) lines.push_back(line.substr(prefix.size()));
  }
  return lines;
}

// DDP_TEST_BIN_DIR: where the programs a test names by their build-tree path
// (DDPRUN_PATH, TRAIN_PATH, ...) are found instead, e.g. the bin/ folder of a
// bundle (scripts/gpu-bundle.sh) carried to a machine without this build tree.
// An argument under the build tree is replaced by the file of the same name in
// that folder, when it is there and executable; anything else is left alone.
namespace {
std::string relocated(const std::string& arg) {
  const char* dir = std::getenv("DDP_TEST_BIN_DIR");
  if (dir == nullptr || *dir == '\0') return arg;
  const std::string build_dir = std::string(DDP_TEST_BUILD_DIR) + "/";
  if (arg.rfind(build_dir, 0) != 0) return arg;
  const std::string candidate = std::string(dir) + "/" + arg.substr(arg.rfind('/') + 1);
  return ::access(candidate.c_str(), X_OK) == 0 ? candidate : arg;
}
}  // namespace

bool process_alive(pid_t pid) {
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  if (stat.empty()) return false;
  auto close_paren = stat.rfind(')');
  return close_paren != std::string::npos && close_paren + 2 < stat.size() &&
         stat[close_paren + 2] != 'Z';
}

bool wait_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

Subprocess::Subprocess(const std::vector<std::string>& argv,
                       const std::map<std::string, std::string>& env) {
  dir_ = make_temp_dir();
  std::map<std::string, std::string> merged;
  for (char** e = environ; *e; ++e) {
    std::string entry = *e;
    auto eq = entry.find('=');
    merged[entry.substr(0, eq)] = eq == std::string::npos ? "" : entry.substr(eq + 1);
  }
  for (const auto& [k, v] : env) {
    if (v == "\x01") {
      merged.erase(k);
    } else {
      merged[k] = v;
    }
  }
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : merged) env_strings.push_back(k + "=" + v);
  std::vector<char*> c_argv, c_env;
  std::vector<std::string> args;
  for (const auto& a : argv) args.push_back(relocated(a));
  for (const auto& a : args) c_argv.push_back(const_cast<char*>(a.c_str()));
  c_argv.push_back(nullptr);
  for (const auto& e : env_strings) c_env.push_back(const_cast<char*>(e.c_str()));
  c_env.push_back(nullptr);
  std::string out_path = dir_ + "/out", err_path = dir_ + "/err";
  start_ = std::chrono::steady_clock::now();
  pid_ = fork();
  if (pid_ == 0) {
    setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int in = open("/dev/null", O_RDONLY);
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    execvpe(c_argv[0], c_argv.data(), c_env.data());
    _exit(127);
  }
  setpgid(pid_, pid_);
}

Subprocess::~Subprocess() {
  if (!reaped_ && pid_ > 0) {
    kill(-pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  std::string cmd = "rm -rf '" + dir_ + "'";
  int ignored = std::system(cmd.c_str());
  (void)ignored;
}

std::string Subprocess::read_out() const { return read_file(dir_ + "/out"); }
std::string Subprocess::read_err() const { return read_file(dir_ + "/err"); }

ProcessResult Subprocess::wait(std::chrono::milliseconds timeout) {
  ProcessResult r;
  int status = 0;
  bool done = wait_until(
      [&] {
        if (reaped_) return true;
        if (waitpid(pid_, &status, WNOHANG) == pid_) reaped_ = true;
        return reaped_;
      },
      timeout);
  if (!done) {
    kill(-pid_, SIGKILL);
    waitpid(pid_, &status, 0);
    reaped_ = true;
    r.exited = false;
  } else {
    r.exited = true;
    r.signaled = WIFSIGNALED(status);
    r.code = r.signaled ? WTERMSIG(status) : WEXITSTATUS(status);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  r.out = read_out();
  r.err = read_err();
  return r;
}

ProcessResult run_process(const std::vector<std::string>& argv,
                          const std::map<std::string, std::string>& env,
                          std::chrono::milliseconds timeout) {
  Subprocess p(argv, env);
  return p.wait(timeout);
}

// A port that was free a moment ago (the test's own listeners make the window harmless).
int free_port(int family) {
  int fd = socket(family, SOCK_STREAM, 0);
  sockaddr_storage addr{};
  socklen_t len;
  if (family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_loopback;
    len = sizeof(sockaddr_in6);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    len = sizeof(sockaddr_in);
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    close(fd);
    return -1;
  }
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  close(fd);
  return port;
}

BusyPort::BusyPort() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  socklen_t len = sizeof(addr);
  if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) == 0 && listen(fd_, 1) == 0 &&
      getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port_ = ntohs(addr.sin_port);
  }
}

BusyPort::~BusyPort() {
  if (fd_ >= 0) close(fd_);
}

int connect_loopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string http_get(int port, const std::string& path) {
  const int fd = connect_loopback(port);
  if (fd < 0) return "";
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (::write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return "";
  }
  std::string resp;
  char buf[8192];
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) resp.append(buf, static_cast<size_t>(n));
  close(fd);
  const auto body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

std::string run_dir(const std::string& log_dir, const std::string& run_id) {
  std::string found;
  std::error_code ignored;
  for (const auto& entry : std::filesystem::directory_iterator(log_dir, ignored)) {
    const std::string name = entry.path().filename().string();
    if (name.size() == run_id.size() + 9 && name.rfind(run_id + "_", 0) == 0) {
      if (!found.empty()) return "";
      found = entry.path().string();
    }
  }
  return found;
}

}  // namespace ddp::testing
