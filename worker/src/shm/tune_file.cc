#include "shm/tune_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "ddp/common/error.h"

namespace ddp::shm {

std::string read_tune_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return "";
    throw Error("shm tune file " + path + " (DDP_SHM_TUNE_FILE) cannot be read: " + std::strerror(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error("shm tune file " + path + " (DDP_SHM_TUNE_FILE) cannot be read: " + std::strerror(errno));
  return text.str();
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
