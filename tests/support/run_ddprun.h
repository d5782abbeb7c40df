#pragma once
// The ddprun under test (DDPRUN_PATH, set by the test's CMake target) run to
// its end: the one wrapper every integration test builds its own on.

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "subprocess.h"

namespace ddp::testing {

// ddprun ARGS..., with `env` as run_process takes it, waited for at most `timeout`.
inline ProcessResult ddprun(std::vector<std::string> args,
                            const std::map<std::string, std::string>& env = {},
                            std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  args.insert(args.begin(), DDPRUN_PATH);
  return run_process(args, env, timeout);
}

}  // namespace ddp::testing
