#pragma once
// Real OpenSSH servers on namespace test hosts (netns_hosts.h), for the
// `ddprun --hostfile` tests: one sshd per chosen host, bound to that host's
// address only, with a host key and a user key made by the test (no
// password: public keys only, as root), and an ssh client config for the
// front end (`ssh -F config()`): that user key, a known_hosts file naming
// every host, strict host key checking. Everything (the sshds and the
// folder of keys and configs) is removed by the destructor, also when a test
// fails; destroy it before the NetnsHosts.

#include <memory>
#include <string>
#include <vector>

#include "netns_hosts.h"
#include "subprocess.h"

namespace ddp::testing {

class SshHosts {
 public:
  // Why sshd cannot run here (no /usr/sbin/sshd or ssh-keygen, not root), or "".
  static std::string unavailable();

  // Starts sshd on `hosts` host i for each i in `which`, answering to
  // names[i] (and its address); a host in `refuse_keys` accepts no key.
  // Throws std::runtime_error when an sshd does not come up.
  SshHosts(const NetnsHosts& hosts, const std::vector<std::string>& names,
           const std::vector<int>& which, const std::vector<int>& refuse_keys = {});
  ~SshHosts();
  SshHosts(const SshHosts&) = delete;
  SshHosts& operator=(const SshHosts&) = delete;

  // The front end's ssh client config file (-F).
  std::string config() const { return dir_ + "/ssh_config"; }
  // Stops host i's sshd (existing sessions go on).
  void stop(int host);

 private:
  std::string dir_;
  std::vector<std::pair<int, std::unique_ptr<Subprocess>>> servers_;
};

}  // namespace ddp::testing
