// The trivial worker of bench/hostfile_launch.sh, compiled: prints
// "START <unix time>" when it runs, passes a TCP barrier on
// MASTER_ADDR:MASTER_PORT (rank 0 accepts WORLD_SIZE - 1 connections, then
// answers each with one byte), and prints "BARRIER <unix time>". The same
// protocol as the script's Python worker, without an interpreter's start-up,
// so a launch is timed rather than the CPU that 16 interpreters need. Reads
// RANK/WORLD_SIZE, else Open MPI's OMPI_COMM_WORLD_RANK/SIZE.

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

double now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

int env_int(const char* name, const char* fallback, int otherwise) {
  const char* v = std::getenv(name);
  if (v == nullptr) v = std::getenv(fallback);
  return v == nullptr ? otherwise : std::atoi(v);
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "barrier_worker: %s\n", what.c_str());
  std::exit(1);
}

void serve(int port, int peers) {
  const int s = socket(AF_INET6, SOCK_STREAM, 0);
  const int on = 1, off = 0;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));  // ddprun holds the port so
  setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_port = htons(static_cast<std::uint16_t>(port));
  addr.sin6_addr = in6addr_any;
  if (bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(s, 128) != 0) {
    die("cannot listen on port " + std::to_string(port));
  }
  std::vector<int> conns;
  while (static_cast<int>(conns.size()) < peers) {
    const int c = accept(s, nullptr, nullptr);
    if (c >= 0) conns.push_back(c);
  }
  for (int c : conns) {
    if (write(c, "x", 1) != 1) die("a peer left before the barrier");
    close(c);
  }
  close(s);
}

void join(const char* host, int port) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host, std::to_string(port).c_str(), &hints, &found) != 0 || found == nullptr) {
    die(std::string("cannot resolve MASTER_ADDR ") + host);
  }
  for (int attempt = 0; attempt < 4000; ++attempt) {  // 20 s: rank 0 may start last
    const int s = socket(found->ai_family, SOCK_STREAM, 0);
    if (connect(s, found->ai_addr, found->ai_addrlen) == 0) {
      char byte = 0;
      if (read(s, &byte, 1) != 1) die("rank 0 closed the barrier");
      close(s);
      freeaddrinfo(found);
      return;
    }
    close(s);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  die(std::string("no barrier on ") + host + ":" + std::to_string(port));
}

}  // namespace

int main() {
  std::printf("START %.6f\n", now());
  std::fflush(stdout);
  const int rank = env_int("RANK", "OMPI_COMM_WORLD_RANK", 0);
  const int world = env_int("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", 1);
  const char* host = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  if (host == nullptr || port == nullptr) die("MASTER_ADDR and MASTER_PORT must be set");
  if (rank == 0) {
    serve(std::atoi(port), world - 1);
  } else {
    join(host, std::atoi(port));
  }
  std::printf("BARRIER %.6f\n", now());
  return 0;
}
