#include "worker_group/stdin_relay.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "ddp/common/error.h"

namespace ddp::launcher {

StdinRelay::StdinRelay() {
  int ends[2];
  if (pipe2(ends, O_CLOEXEC) != 0) throw Error(std::string("stdin pipe: ") + std::strerror(errno));
  read_end_ = ends[0];
  write_end_ = ends[1];
  // A worker that never reads must not stall ddprun: a full pipe drops the typing.
  fcntl(write_end_, F_SETFL, O_NONBLOCK);
}

StdinRelay::~StdinRelay() {
  close_worker_end();
  if (write_end_ >= 0) close(write_end_);
}

void StdinRelay::close_worker_end() {
  if (read_end_ >= 0) close(read_end_);
  read_end_ = -1;
}

int StdinRelay::poll_fd() const {
  if (write_end_ < 0) return -1;
  const pid_t foreground = tcgetpgrp(STDIN_FILENO);
  return foreground == getpgrp() ? STDIN_FILENO : -1;
}

void StdinRelay::pump() {
  char buf[4096];
  const ssize_t got = read(STDIN_FILENO, buf, sizeof(buf));
  if (got < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (got > 0 && write(write_end_, buf, static_cast<size_t>(got)) >= 0) return;
  if (got > 0 && errno == EAGAIN) return;  // the worker reads nothing: this typing is dropped
  close(write_end_);                       // end of input, or the worker is gone
  write_end_ = -1;
}

}  // namespace ddp::launcher
