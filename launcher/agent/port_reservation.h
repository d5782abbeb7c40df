#pragma once
// Holds MASTER_PORT for the worker group so nothing else on the machine can
// take it between the moment ddprun picks it and the moment rank 0's program
// binds it (the bind-to-0-then-close race). The socket is bound to the
// wildcard address with SO_REUSEADDR and never listens: the kernel will not
// hand the port to any other bind(0) or outgoing connection, while the
// program (PyTorch's TCPStore, Gloo, any server setting SO_REUSEADDR) can
// still bind and listen on it. Released when the object is destroyed.

#include <string>

namespace ddp::launcher {

class PortReservation {
 public:
  // port == 0: the kernel picks a free port. Throws ddp::Error naming `flag`
  // and the port when it is already in use (something listens on it).
  static PortReservation reserve(int port, const std::string& flag = "--master_port");

  PortReservation(PortReservation&& other) noexcept;
  PortReservation& operator=(PortReservation&& other) noexcept;
  PortReservation(const PortReservation&) = delete;
  PortReservation& operator=(const PortReservation&) = delete;
  ~PortReservation();

  int port() const { return port_; }

 private:
  PortReservation(int fd, int port) : fd_(fd), port_(port) {}
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace ddp::launcher
