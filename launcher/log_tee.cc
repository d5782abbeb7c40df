#include "log_tee.h"

#include <unistd.h>

#include <cerrno>

namespace ddp::launcher {
namespace {

void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // console or disk gone: drop rather than block the supervisor
    data += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

StreamTee::~StreamTee() {
  if (target_.file_fd >= 0) close(target_.file_fd);
}

void StreamTee::write(const char* data, size_t size) {
  if (target_.file_fd >= 0) write_all(target_.file_fd, data, size);
  splitter_.feed(data, size, [this](const std::string& line) { emit(line); });
}

void StreamTee::flush() {
  splitter_.flush([this](const std::string& line) { emit(line); });
}

void StreamTee::emit(const std::string& line) {
  if (target_.console_fd >= 0) {
    std::string out;
    out.reserve(target_.prefix.size() + line.size() + 1);
    out += target_.prefix;
    out += line;
    out += '\n';
    write_all(target_.console_fd, out.data(), out.size());
  }
  if (target_.keep_last_lines > 0) {
    last_lines_.push_back(line);
    if (last_lines_.size() > target_.keep_last_lines) last_lines_.pop_front();
  }
}

}  // namespace ddp::launcher
