#include "core/carried_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "ddp/common/error.h"

namespace ddp::detail {
namespace {

// The heir's file renamed to `name`, open; -1 when there is none of `bytes`.
int take_over(const std::string& heir, const std::string& name, std::size_t bytes) {
  if (heir.empty()) return -1;
  // shm_open's names are files of /dev/shm (glibc on Linux).
  if (std::rename(("/dev/shm" + heir).c_str(), ("/dev/shm" + name).c_str()) != 0) return -1;
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  struct stat st {};
  if (fd >= 0 && fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) == bytes) return fd;
  if (fd >= 0) close(fd);
  shm_unlink(name.c_str());
  return -1;
}

}  // namespace

CarriedFile make_carried_file(const std::string& name, std::size_t bytes, const std::string& heir,
                              const std::string& what) {
  if (const int fd = take_over(heir, name, bytes); fd >= 0) return {fd, true};
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw Error(what + ": cannot create " + name + " (/dev/shm): " + std::strerror(errno));
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const std::string why = std::strerror(errno);
    shm_unlink(name.c_str());
    close(fd);
    throw Error(what + ": cannot size " + name + " to " + std::to_string(bytes >> 20) +
                " MiB: " + why);
  }
  return {fd, false};
}

std::size_t resident_bytes(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 ? static_cast<std::size_t>(st.st_blocks) * 512 : 0;
}

}  // namespace ddp::detail
