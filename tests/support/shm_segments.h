#pragma once
// Test support: the POSIX shared-memory segments a run left in /dev/shm.

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "ddp/common/shm_names.h"

namespace ddp::testing {

// Names (without the leading slash) of /dev/shm entries of run `run_id`.
inline std::vector<std::string> shm_segments_of(const std::string& run_id) {
  const std::string prefix = shm_run_prefix(run_id);
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) names.push_back(name);
  }
  return names;
}

}  // namespace ddp::testing
