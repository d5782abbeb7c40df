#include "netns_hosts.h"

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "subprocess.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;

// Runs `ip ARGS...`; returns its result (bounded).
ProcessResult ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"ip"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, {}, 20s);
}

void must(const std::vector<std::string>& args) {
  ProcessResult r = ip(args);
  if (!r.exited || r.code != 0) {
    std::string cmd = "ip";
    for (const auto& a : args) cmd += " " + a;
    throw std::runtime_error("test hosts: '" + cmd + "' failed: " + r.err);
  }
}

// Namespaces are named "ddpt<pid>-..."; remove those of test processes that are gone.
void remove_stale_namespaces() {
  ProcessResult r = ip({"netns", "list"});
  if (!r.exited || r.code != 0) return;
  for (const auto& line : lines_with_prefix(r.out, "ddpt")) {
    const std::string name = "ddpt" + line.substr(0, line.find(' '));
    const auto dash = line.find('-');
    if (dash == std::string::npos) continue;
    const pid_t owner = static_cast<pid_t>(std::atol(line.substr(0, dash).c_str()));
    if (owner > 0 && kill(owner, 0) != 0) {
      ip({"netns", "del", name});
      std::error_code ignored;
      std::filesystem::remove_all("/etc/netns/" + name, ignored);
    }
  }
}

}  // namespace

std::string NetnsHosts::unavailable() {
  if (geteuid() != 0) return "needs root to create network namespaces (CI runs as root)";
  ProcessResult r = run_process({"ip", "netns", "list"}, {}, 10s);
  if (!r.exited || r.code != 0)
    return "'ip netns' does not work here (iproute2 missing?): " + r.err;
  const std::string probe = "ddpt" + std::to_string(getpid()) + "-probe";
  ProcessResult add = ip({"netns", "add", probe});
  if (!add.exited || add.code != 0) return "cannot create a network namespace: " + add.err;
  ip({"netns", "del", probe});
  return "";
}

NetnsHosts::NetnsHosts(int count) {
  remove_stale_namespaces();
  static int serial = 0;
  prefix_ = "ddpt" + std::to_string(getpid()) + "-" + std::to_string(serial++);
  switch_ = prefix_ + "-sw";
  try {
    must({"netns", "add", switch_});
    must({"-n", switch_, "link", "add", "br0", "type", "bridge"});
    must({"-n", switch_, "link", "set", "br0", "up"});
    for (int i = 0; i < count; ++i) {
      const std::string host = prefix_ + "-h" + std::to_string(i);
      must({"netns", "add", host});
      hosts_.push_back(host);
      const std::string port = "p" + std::to_string(i);
      must({"-n", switch_, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns",
            host});
      must({"-n", switch_, "link", "set", port, "master", "br0", "up"});
      must({"-n", host, "addr", "add", address(i) + "/24", "dev", "eth0"});
      // nodad: usable at once, not after duplicate address detection.
      must({"-n", host, "addr", "add", address6(i) + "/64", "dev", "eth0", "nodad"});
      must({"-n", host, "link", "set", "eth0", "up"});
      must({"-n", host, "link", "set", "lo", "up"});
    }
  } catch (...) {
    remove_all();
    throw;
  }
}

NetnsHosts::~NetnsHosts() { remove_all(); }

namespace {

// Every process still in namespace `name` (what a test started there and
// left: an sshd session, a worker), killed so that nothing outlives the host.
void kill_processes_in(const std::string& name) {
  FILE* pids = popen(("ip netns pids " + name + " 2>/dev/null").c_str(), "r");
  if (pids == nullptr) return;
  for (long pid = 0; std::fscanf(pids, "%ld", &pid) == 1;) {
    if (pid > 1) kill(static_cast<pid_t>(pid), SIGKILL);
  }
  pclose(pids);
}

}  // namespace

void NetnsHosts::kill_everything_on(int host) const { kill_processes_in(hosts_.at(host)); }

void NetnsHosts::remove_all() {
  for (const auto& host : hosts_) {
    kill_processes_in(host);
    ip({"netns", "del", host});
    std::error_code ignored;
    std::filesystem::remove_all("/etc/netns/" + host, ignored);
  }
  hosts_.clear();
  if (!switch_.empty()) ip({"netns", "del", switch_});
  switch_.clear();
}

std::string NetnsHosts::address(int host) const { return "198.18.0." + std::to_string(host + 1); }
std::string NetnsHosts::address6(int host) const { return "2001:2::" + std::to_string(host + 1); }

std::vector<std::string> NetnsHosts::on(int host, const std::vector<std::string>& argv) const {
  std::vector<std::string> full = {"ip", "netns", "exec", hosts_.at(static_cast<size_t>(host))};
  full.insert(full.end(), argv.begin(), argv.end());
  return full;
}

void NetnsHosts::name_hosts(const std::vector<std::string>& names,
                            bool own_name_on_loopback) const {
  for (size_t h = 0; h < hosts_.size(); ++h) {
    std::string table = "127.0.0.1 localhost\n";
    for (size_t i = 0; i < names.size() && i < hosts_.size(); ++i) {
      const bool self = own_name_on_loopback && i == h;
      table +=
          (self ? std::string("127.0.1.1") : address(static_cast<int>(i))) + " " + names[i] + "\n";
    }
    std::filesystem::create_directories("/etc/netns/" + hosts_[h]);
    write_file("/etc/netns/" + hosts_[h] + "/hosts", table);
  }
}

void NetnsHosts::set_link(int host, bool up) const {
  must({"-n", switch_, "link", "set", "p" + std::to_string(host), up ? "up" : "down"});
}

}  // namespace ddp::testing
