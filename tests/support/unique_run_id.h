#pragma once
// Test support: a run id no other test (or concurrent test process) uses.
// Letters and digits when `tag` is, so its /dev/shm prefix is exactly
// "ddp-<run id>-". Thread-safe.

#include <unistd.h>

#include <atomic>
#include <string>

namespace ddp::testing {

inline std::string unique_run_id(const std::string& tag) {
  static std::atomic<int> runs{0};
  return tag + std::to_string(getpid()) + "x" + std::to_string(runs++);
}

}  // namespace ddp::testing
