#include "group_setup.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "ddp/common/error.h"

namespace ddprun_torch {
namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

// What names this rank's machine. A launcher's node index (GROUP_RANK, set by
// ddprun and torchrun alike) when there is one; else the host name, the boot
// and the network namespace, so two network namespaces of one machine (which
// may not see each other's loopback) count as two nodes.
std::string node_identity() {
  if (const char* group_rank = std::getenv("GROUP_RANK"); group_rank != nullptr && *group_rank) {
    return "launcher-node-" + std::string(group_rank);
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  struct stat net {};
  stat("/proc/self/ns/net", &net);
  return std::string(host) + "/" + boot + "/" + std::to_string(net.st_ino);
}

std::string random_token() {
  std::random_device device;
  std::ostringstream out;
  out << std::hex << device() << device();
  return out.str();
}

// This rank's address for Gloo's connections across nodes: ddprun's
// DDP_NODE_ADDR; else the local address of the route to MASTER_ADDR (what
// the store's host reaches this machine by); else this host name's address.
std::string peer_address() {
  if (std::string addr = env_or("DDP_NODE_ADDR", ""); !addr.empty()) return addr;
  const std::string master = env_or("MASTER_ADDR", "");
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string target = master.empty() ? std::string(host) : master;
  if (getaddrinfo(target.c_str(), "9", &hints, &found) != 0 || found == nullptr) return "127.0.0.1";
  std::string result = "127.0.0.1";
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    char text[INET_ADDRSTRLEN] = {};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text)) != nullptr) {
      result = text;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return result;
}

// Every rank's node identity, in rank order (each sets its own, reads all).
std::vector<std::string> exchange_nodes(const BackendSetup& setup, ddp::Store& store) {
  store.set("ddp/node/" + std::to_string(setup.rank), node_identity());
  std::vector<std::string> keys;
  for (int r = 0; r < setup.size; ++r) keys.push_back("ddp/node/" + std::to_string(r));
  try {
    store.wait(keys, setup.timeout);
  } catch (const ddp::Error&) {
    std::string missing;
    for (int r = 0; r < setup.size; ++r) {
      try {
        store.get(keys[r], std::chrono::milliseconds(1));
      } catch (const ddp::Error&) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    throw ddp::Error("backend ddp: group '" + setup.group_id + "' of " +
                     std::to_string(setup.size) + " ranks: rank(s) " + missing +
                     " did not arrive within " + std::to_string(setup.timeout.count() / 1000) +
                     " s (the timeout given to init_process_group or new_group)");
  }
  std::vector<std::string> nodes;
  for (const auto& key : keys) nodes.push_back(store.get(key, setup.timeout));
  return nodes;
}

// Node indices by first appearance; shm only when each node's ranks are
// consecutive and some node holds two of them.
ddp::MemberSet members_of(const std::vector<std::string>& nodes, bool* shm) {
  std::map<std::string, int> index;
  ddp::MemberSet set;
  bool consecutive = true;
  bool shared = false;
  for (int r = 0; r < static_cast<int>(nodes.size()); ++r) {
    auto [it, fresh] = index.emplace(nodes[r], static_cast<int>(index.size()));
    if (!fresh && it->second != set.members.back().node) consecutive = false;
    if (!fresh) shared = true;
    set.members.push_back(ddp::Member{r, it->second});
  }
  *shm = consecutive && shared;
  if (!consecutive) {
    for (auto& member : set.members) member.node = member.id;  // Gloo: one rank a "node"
  }
  return set;
}

}  // namespace

std::shared_ptr<ddp::ProcessGroup> make_cpu_group(const BackendSetup& setup,
                                                  const std::shared_ptr<ddp::Store>& store) {
  ddp::ProcessGroupOptions options;
  options.timeout = setup.timeout;
  if (setup.size == 1) {
    options.backend = "local";
    return ddp::ProcessGroup::create(0, 1, nullptr, options);
  }
  bool shm = false;
  ddp::MemberSet members = members_of(exchange_nodes(setup, *store), &shm);
  if (setup.rank == 0) store->set("ddp/token", random_token());
  const std::string token = store->get("ddp/token", setup.timeout);
  options.backend = shm ? "shm" : "gloo";
  options.host = peer_address();
  // Under ddprun the run's id names the shm segments, so ddprun sweeps
  // them whatever ends the job; the token keeps two groups apart.
  options.run_id = env_or("DDP_RUN_ID", "torch");
  options.round = std::strtol(env_or("DDP_ROUND", "0").c_str(), nullptr, 10);
  options.group_name = "t" + setup.group_id.substr(0, 24) + "-" + token;
  return ddp::ProcessGroup::create(members, setup.rank, store, options);
}

std::shared_ptr<ddp::ProcessGroup> make_cuda_group(const BackendSetup& setup,
                                                   const std::shared_ptr<ddp::Store>& store,
                                                   int device) {
  ddp::ProcessGroupOptions options;
  options.backend = "nccl";
  options.timeout = setup.timeout;
  options.device = device;
  return ddp::ProcessGroup::create(setup.rank, setup.size,
                                   ddp::make_prefix_store(store, "ddp/cuda"), options);
}

}  // namespace ddprun_torch
