#pragma once
// The rendezvous server's own TCP acceptor (plaintext serving only).
//
// gRPC's acceptor stops accepting for good once accept() fails with EMFILE,
// even after the connections that used the descriptors close (grpc/grpc#16058,
// #20418, #31080), so anyone who could reach the port could switch the
// rendezvous off by opening connections. This acceptor listens itself and
// hands each connection to gRPC only once it has started with the HTTP/2
// client preface, or (with a torch store) at once with the first byte of a
// torch.distributed TCPStore query (torch_store_protocol.h), which goes to
// the store instead: gRPC and the store share the port.
//   - out of descriptors: it keeps one spare descriptor, closes it to accept
//     and drop the waiting connection, reopens it, and goes on accepting;
//   - descriptors near the open-file limit (the last quarter, at most 64) are
//     kept for the process's own use: a connection landing there is closed;
//   - a connection that has not sent the preface (or a query) within
//     handshake_timeout_ms, or sends anything else, is closed; at most
//     max_unready wait at once (the oldest is dropped for a new one). A torch
//     client sends its first query when it connects (2.x: VALIDATE; 1.x: the
//     ADD of its constructor when it is given a world size).
// TLS serving keeps gRPC's acceptor (its handshake is TLS, not HTTP/2).
//
// Thread-safety: start() and stop() from one thread; the hand-over callback
// runs on the acceptor's thread.

#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace ddp::launcher {

class ConnectionAcceptor {
 public:
  struct Options {
    std::string host;  // an address or name; "::" is every interface, IPv4 too
    int port = 0;      // 0: the kernel picks one
    int handshake_timeout_ms = 10000;
    size_t max_unready = 1024;
  };
  // Receives a connected, non-blocking socket; owns it from then on.
  using HandOver = std::function<void(int fd)>;

  // Binds and listens on every address `host` resolves to. Throws ddp::Error
  // naming host:port and the reason when none can be bound. `store`
  // (may be empty: such connections are closed) receives the TCPStore ones.
  ConnectionAcceptor(const Options& options, HandOver hand_over, HandOver store = {});
  ~ConnectionAcceptor();  // stop()
  ConnectionAcceptor(const ConnectionAcceptor&) = delete;
  ConnectionAcceptor& operator=(const ConnectionAcceptor&) = delete;

  int port() const { return port_; }
  void start();  // accepts on a thread of its own from now on
  // Stops accepting, closes the listening sockets and the connections not
  // handed over yet. Idempotent.
  void stop();

 private:
  void run();

  Options options_;
  HandOver hand_over_;
  HandOver torch_store_;
  std::vector<int> listeners_;
  int port_ = 0;
  int wake_fd_ = -1;
  std::thread thread_;
};

}  // namespace ddp::launcher
