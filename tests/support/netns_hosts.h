#pragma once
// Test hosts in network namespaces: N hosts, each a namespace with one
// interface (eth0, 198.18.0.<i+1>/24, the range set aside for network
// benchmarks) on a bridge that lives in a namespace of its own, so nothing in
// the machine's own namespace changes. Taking a host's link down partitions
// it. Everything is removed by the destructor, also when a test fails;
// namespaces left by a test binary that was killed are removed by the next.

#include <string>
#include <vector>

namespace ddp::testing {

class NetnsHosts {
 public:
  // Why hosts cannot be made here (not root, no `ip`, no namespaces), or "".
  static std::string unavailable();

  explicit NetnsHosts(int count);  // throws std::runtime_error naming the failed command
  ~NetnsHosts();
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  int size() const { return static_cast<int>(hosts_.size()); }
  std::string address(int host) const;  // "198.18.0.<host+1>"
  // Its IPv6 address, "2001:2::<host+1>" (RFC 5180's benchmarking range, as
  // 198.18.0.0/15 is for IPv4), on the same link.
  std::string address6(int host) const;
  // argv run inside the host's namespace (`ip netns exec NAME argv...`).
  std::vector<std::string> on(int host, const std::vector<std::string>& argv) const;
  // Takes the host's link down (a partition) or up again.
  void set_link(int host, bool up) const;
  // SIGKILLs every process in the host: the machine is lost.
  void kill_everything_on(int host) const;
  // Host i answers to names[i] on every host, as on a cluster with DNS:
  // writes /etc/netns/<namespace>/hosts, which `ip netns exec` mounts over
  // /etc/hosts for what it starts (removed with the hosts). With
  // `own_name_on_loopback`, each host maps its own name to 127.0.1.1, as
  // Debian's and Ubuntu's installers write /etc/hosts.
  void name_hosts(const std::vector<std::string>& names, bool own_name_on_loopback = false) const;

 private:
  void remove_all();

  std::string prefix_;
  std::string switch_;
  std::vector<std::string> hosts_;
};

}  // namespace ddp::testing
