#include "ddp/common/proc_stat.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ddp {

const char* read_proc_stat(int proc, const char* dir, char (&buf)[512]) {
  char path[48];
  const std::size_t len = std::strlen(dir);
  if (len > 40) {
    errno = ENAMETOOLONG;
    return nullptr;
  }
  std::memcpy(path, dir, len);
  std::memcpy(path + len, "/stat", 6);
  const int fd = openat(proc, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  const ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n < 0) return nullptr;
  buf[n] = '\0';
  // "pid (comm) S ppid pgrp ...": comm may hold ')', so find the last one.
  const char* paren = std::strrchr(buf, ')');
  if (paren == nullptr || paren[1] != ' ' || paren[2] == '\0') {
    errno = EINVAL;
    return nullptr;
  }
  return paren + 2;
}

bool process_exited(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  char buf[512];
  const char* state = read_proc_stat(pid, buf);
  if (state != nullptr) return proc_state_exited(*state);
  if (errno == EINVAL) return false;
  // Gone since kill(2) looked (reaped), or no /proc to read: ask kill(2) again.
  return kill(pid, 0) != 0 && errno == ESRCH;
}

const char* read_proc_stat(pid_t pid, char (&buf)[512]) {
  char dir[32] = "/proc/";  // "/proc/<pid>", without snprintf (no locale)
  char digits[16];
  int count = 0;
  for (long left = pid; left > 0 && count < 15; left /= 10) digits[count++] = '0' + left % 10;
  std::size_t at = 6;
  while (count > 0) dir[at++] = digits[--count];
  dir[at] = '\0';
  return read_proc_stat(AT_FDCWD, dir, buf);
}

}  // namespace ddp
