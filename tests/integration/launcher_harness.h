#pragma once
// What the launcher's integration tests share: ddprun and the test worker
// run as a user runs them, and the worker's "ENV" lines read back.

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "run_ddprun.h"
#include "subprocess.h"

namespace ddp::testing::launcher_test {

using namespace std::chrono_literals;

inline const std::string kDdprun = DDPRUN_PATH;
inline const std::string kWorker = TEST_WORKER_PATH;

using ::ddp::testing::ddprun;  // tests/support/run_ddprun.h

// Parses "[rank R] ENV NAME=value" lines into rank -> name -> value.
inline std::map<int, std::map<std::string, std::string>> env_by_rank(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> result;
  for (const auto& line : lines_with_prefix(out, "[rank ")) {
    int rank = std::stoi(line);
    auto body = line.substr(line.find("] ") + 2);
    if (body.rfind("ENV ", 0) != 0) continue;
    auto eq = body.find('=');
    result[rank][body.substr(4, eq - 4)] = body.substr(eq + 1);
  }
  return result;
}

}  // namespace ddp::testing::launcher_test
