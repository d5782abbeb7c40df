#include "backends/shm/tune_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "ddp/common/error.h"

namespace ddp::shm {

std::string read_tune_file(const std::string& path) {
  auto failed = [&](const std::string& why) {
    return Error("shm tune file " + path + " (DDP_SHM_TUNE_FILE) cannot be read: " + why);
  };
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return "";
    throw failed(std::strerror(errno));
  }
  std::string text;
  struct stat st {};
  if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    close(fd);
    throw failed("it is a folder");
  }
  char buffer[4096];
  for (;;) {
    const ssize_t got = read(fd, buffer, sizeof buffer);
    if (got == 0) break;
    if (got < 0) {
      if (errno == EINTR) continue;
      const std::string why = std::strerror(errno);
      close(fd);
      throw failed(why);
    }
    text.append(buffer, static_cast<std::size_t>(got));
  }
  close(fd);
  return text;
}

std::string write_tune_file(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) return "cannot create " + temporary + ": " + std::strerror(errno);
    out << text;
    out.flush();
    if (!out) {
      std::remove(temporary.c_str());
      return "cannot write " + temporary + ": " + std::strerror(errno);
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(temporary.c_str());
    return "cannot replace " + path + ": " + why;
  }
  return "";
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) return "";
    std::string model = line.substr(colon + 1);
    while (!model.empty() && model.front() == ' ') model.erase(model.begin());
    return model;
  }
  return "";
}

}  // namespace ddp::shm
