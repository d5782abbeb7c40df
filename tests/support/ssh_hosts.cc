#include "ssh_hosts.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <stdexcept>

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
const char* const kSshd = "/usr/sbin/sshd";

void must_run(const std::vector<std::string>& argv) {
  ProcessResult r = run_process(argv, {}, 30s);
  if (!r.exited || r.code != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += a + " ";
    throw std::runtime_error("ssh hosts: '" + cmd + "' failed: " + r.err);
  }
}

std::string sshd_config(const std::string& dir, const std::string& address,
                        const std::string& address6, bool refuse) {
  return "ListenAddress " + address + "\nListenAddress " + address6 + "\nPort 22\nHostKey " + dir +
         "/host_key\nPidFile none\n" + "AuthorizedKeysFile " + dir +
         (refuse ? "/no_keys" : "/authorized_keys") + "\n" +
         "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
         "PermitRootLogin prohibit-password\nUsePAM no\nStrictModes no\nUseDNS no\n"
         "MaxStartups 200\nMaxSessions 200\nLogLevel ERROR\n";
}

}  // namespace

std::string SshHosts::unavailable() {
  if (geteuid() != 0) return "needs root to run sshd on test hosts (CI runs as root)";
  if (access(kSshd, X_OK) != 0)
    return "no /usr/sbin/sshd (Debian's openssh-server; scripts/install-deps.sh installs it)";
  if (access("/usr/bin/ssh-keygen", X_OK) != 0 || access("/usr/bin/ssh", X_OK) != 0)
    return "no ssh or ssh-keygen (Debian's openssh-client)";
  return "";
}

SshHosts::SshHosts(const NetnsHosts& hosts, const std::vector<std::string>& names,
                   const std::vector<int>& which, const std::vector<int>& refuse_keys) {
  dir_ = make_temp_dir();
  chmod(dir_.c_str(), 0700);
  must_run({"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", dir_ + "/host_key"});
  must_run({"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", dir_ + "/id_ed25519"});
  write_file(dir_ + "/authorized_keys", read_file(dir_ + "/id_ed25519.pub"));
  write_file(dir_ + "/no_keys", "");
  std::string host_key = read_file(dir_ + "/host_key.pub");
  host_key = host_key.substr(0, host_key.find(' ', host_key.find(' ') + 1));  // "type base64"
  std::string known;
  for (int i = 0; i < hosts.size(); ++i) {
    known += names.at(static_cast<size_t>(i)) + "," + hosts.address(i) + "," + hosts.address6(i) +
             " " + host_key + "\n";
  }
  write_file(dir_ + "/known_hosts", known);
  write_file(dir_ + "/ssh_config",
             "Host *\n  User root\n  IdentityFile " + dir_ + "/id_ed25519\n" +
                 "  IdentitiesOnly yes\n  UserKnownHostsFile " + dir_ + "/known_hosts\n" +
                 "  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n" +
                 "  LogLevel ERROR\n");
  std::filesystem::create_directories("/run/sshd");  // sshd's privilege-separation folder
  for (int i : which) {
    const bool refuse = std::find(refuse_keys.begin(), refuse_keys.end(), i) != refuse_keys.end();
    const std::string config = dir_ + "/sshd_config_" + std::to_string(i);
    write_file(config, sshd_config(dir_, hosts.address(i), hosts.address6(i), refuse));
    // setpriv: an sshd dies with this test process, even when it is killed
    // (its namespaces are then removed by the next test's NetnsHosts).
    std::vector<std::string> argv = {kSshd, "-D", "-e", "-f", config};
    if (access("/usr/bin/setpriv", X_OK) == 0)
      argv.insert(argv.begin(), {"/usr/bin/setpriv", "--pdeathsig", "KILL"});
    servers_.emplace_back(i, std::make_unique<Subprocess>(hosts.on(i, argv)));
  }
  // Up when a connection to port 22 of each host is answered (from that host).
  for (auto& [i, server] : servers_) {
    const std::string probe = "exec 3<>/dev/tcp/" + hosts.address(i) + "/22";
    const bool up = wait_until(
        [&] {
          return run_process(hosts.on(i, {"bash", "-c", probe}), {}, 5s).code == 0;
        },
        10s);
    if (!up)
      throw std::runtime_error("sshd on test host " + std::to_string(i) +
                               " did not come up: " + server->read_err());
  }
}

SshHosts::~SshHosts() {
  servers_.clear();  // each Subprocess kills its sshd's process group
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

void SshHosts::stop(int host) {
  for (auto it = servers_.begin(); it != servers_.end(); ++it) {
    if (it->first == host) {
      servers_.erase(it);
      return;
    }
  }
}

}  // namespace ddp::testing
