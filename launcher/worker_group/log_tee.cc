#include "worker_group/log_tee.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "worker_group/process.h"

namespace ddp::launcher {
namespace {

// Writes everything, waiting while `fd` is full (EAGAIN), unless ddprun is
// asked to stop meanwhile. Returns the errno that ended it early, or 0.
int write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pfd{fd, POLLOUT, 0};
      if (::poll(&pfd, 1, 100) < 0 && errno != EINTR) return errno;
      if (!(pfd.revents & POLLOUT) && stop_signal_pending()) return EAGAIN;
      continue;
    }
    if (n < 0) return errno;  // console or disk gone (EPIPE, ENOSPC, EIO)
    if (n == 0) return EIO;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

StreamTee::~StreamTee() {
  if (target_.file_fd >= 0) close(target_.file_fd);
}

void StreamTee::write(const char* data, size_t size) {
  if (size > 0) last_output_ = std::chrono::steady_clock::now();
  if (target_.file_fd >= 0 && !file_failed_) {
    if (int err = write_all(target_.file_fd, data, size); err != 0) {
      file_failed_ = true;  // say it once; the console still gets the lines
      std::string warning = "[ddprun] warning: writing " + target_.file_path + " failed (" +
                            std::strerror(err) + "); the rest of this stream is not in the file\n";
      write_all(STDERR_FILENO, warning.data(), warning.size());
    }
  }
  splitter_.feed(
      data, size, [this](const std::string& line, bool redrawn) { emit(line, redrawn); },
      [this](const std::string& text) { redraw(text); });
}

void StreamTee::flush() {
  splitter_.flush([this](const std::string& line, bool redrawn) { emit(line, redrawn); });
}

void StreamTee::to_console(const std::string& text) {
  if (target_.console_fd < 0 || console_closed_) return;
  if (write_all(target_.console_fd, text.data(), text.size()) == EPIPE) console_closed_ = true;
}

void StreamTee::redraw(const std::string& text) {
  if (target_.console_fd < 0) return;
  std::string out;
  out.reserve(target_.prefix.size() + text.size() + 1);
  out += target_.prefix;
  out += text;
  out += '\r';
  to_console(out);
}

void StreamTee::emit(const std::string& line, bool redrawn) {
  if (redrawn && target_.console_fd >= 0) {
    to_console("\n");  // the line is on the console already
  } else if (target_.console_fd >= 0) {
    std::string out;
    out.reserve(target_.prefix.size() + line.size() + 1);
    out += target_.prefix;
    out += line;
    out += '\n';
    to_console(out);
  }
  if (target_.keep_last_lines > 0) {
    last_lines_.push_back(line);
    if (last_lines_.size() > target_.keep_last_lines) last_lines_.pop_front();
  }
}

}  // namespace ddp::launcher
