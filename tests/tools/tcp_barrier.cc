#include "tcp_barrier.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "ddp/common/error.h"

namespace ddp::testing {
namespace {

using Clock = std::chrono::steady_clock;

int remaining_ms(Clock::time_point deadline) {
  auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

void serve(const WorkerEnv& env, Clock::time_point deadline) {
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1, zero = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_any;
  addr.sin6_port = htons(static_cast<uint16_t>(env.master_port));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 1024) != 0) {
    std::string why = std::strerror(errno);
    close(fd);
    throw Error("rank 0: cannot listen on MASTER_PORT " + std::to_string(env.master_port) + ": " +
                why);
  }
  std::vector<int> peers;
  std::vector<bool> arrived(env.world_size, false);
  arrived[0] = true;
  while (static_cast<int>(peers.size()) < env.world_size - 1) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, remaining_ms(deadline)) <= 0) {
      std::string missing;
      for (int r = 0; r < env.world_size; ++r) {
        if (arrived[r]) continue;
        if (!missing.empty()) missing += ',';
        missing += std::to_string(r);
      }
      for (int c : peers) close(c);
      close(fd);
      throw Error("barrier timed out; ranks that never arrived: " + missing);
    }
    int c = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    int rank = -1;
    if (recv(c, &rank, sizeof(rank), MSG_WAITALL) == sizeof(rank) && rank > 0 &&
        rank < env.world_size) {
      arrived[rank] = true;
      peers.push_back(c);
    } else {
      close(c);
    }
  }
  char go = 1;
  for (int c : peers) {
    ssize_t ignored = send(c, &go, 1, MSG_NOSIGNAL);
    (void)ignored;
    close(c);
  }
  close(fd);
}

void join(const WorkerEnv& env, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port = std::to_string(env.master_port);
  if (getaddrinfo(env.master_addr.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) {
    throw Error("cannot resolve MASTER_ADDR " + env.master_addr);
  }
  for (;;) {
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
      int rank = env.rank;
      char go = 0;
      bool ok = send(fd, &rank, sizeof(rank), MSG_NOSIGNAL) == sizeof(rank);
      pollfd p{fd, POLLIN, 0};
      ok = ok && poll(&p, 1, remaining_ms(deadline)) == 1 && recv(fd, &go, 1, 0) == 1;
      close(fd);
      freeaddrinfo(res);
      if (!ok)
        throw Error("barrier: rank 0 at " + env.master_addr + ":" + port +
                    " went away or timed out");
      return;
    }
    close(fd);
    if (remaining_ms(deadline) == 0) {
      freeaddrinfo(res);
      throw Error("barrier: could not reach rank 0 at " + env.master_addr + ":" + port);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // rank 0 not listening yet
  }
}

}  // namespace

void tcp_barrier(const WorkerEnv& env, int timeout_ms) {
  if (env.world_size == 1) return;
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  if (env.rank == 0) {
    serve(env, deadline);
  } else {
    join(env, deadline);
  }
}

}  // namespace ddp::testing
