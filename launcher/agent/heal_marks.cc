#include "agent/heal_marks.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "ddp/common/error.h"
#include "ddp/common/launcher_log.h"

namespace ddp::launcher {

HealMarks::HealMarks(const std::string& run_id) {
  const char* tmp = std::getenv("TMPDIR");
  std::string buf = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/ddprun-heal-" +
                    run_id + "-XXXXXX";
  if (mkdtemp(buf.data()) == nullptr) {
    throw Error("TMPDIR: cannot create the heal marks' directory '" + buf +
                "' (--on_failure=heal): " + std::strerror(errno));
  }
  dir_ = buf;
}

HealMarks::~HealMarks() {
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::string HealMarks::path(const std::string& dir, int local_rank) {
  return dir + "/local_rank_" + std::to_string(local_rank);
}

bool HealMarks::exists(int local_rank) const {
  struct stat st {};
  return stat(path(local_rank).c_str(), &st) == 0;
}

void HealMarks::clear(int local_rank) const {
  const std::string mark = path(local_rank);
  if (unlink(mark.c_str()) != 0 && errno != ENOENT) {
    launcher_log().warn("cannot remove the stale heal mark {}: {}", mark, std::strerror(errno));
  }
}

}  // namespace ddp::launcher
