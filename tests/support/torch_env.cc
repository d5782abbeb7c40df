#include "torch_env.h"

#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>

#include "debian_torch.h"
#include "subprocess.h"

namespace ddp::testing {

const std::string& torch2_python() {
  static const std::string python = DDP_TORCH_PYTHON;
  return python;
}

std::string torch2_unavailable_reason(const std::string& module) {
  static std::mutex mutex;
  static std::map<std::string, std::string> reasons;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto known = reasons.find(module); known != reasons.end()) return known->second;

  const std::string& python = torch2_python();
  const std::string hint =
      " (scripts/install-torch-env.sh installs torch 2.x, Lightning, Accelerate and DeepSpeed"
      " there;"
      " cmake -DDDP_TORCH_PYTHON=... names another interpreter)";
  const std::string imports = module == "torch" ? "torch" : "torch, " + module;
  std::string reason;
  std::error_code ignored;
  if (!std::filesystem::exists(python, ignored)) {
    reason = "no torch 2.x interpreter at " + python + hint;
  } else {
    // Exit 3: a torch older than 2, named on stderr.
    const std::string script =
        "import sys, torch\n"
        "if int(torch.__version__.split('.')[0]) < 2:\n"
        "    print(torch.__version__, file=sys.stderr); sys.exit(3)\n"
        "import " +
        module + "\n";
    auto r = run_process({python, "-c", script}, {}, std::chrono::seconds(120));
    if (!r.exited) {
      reason = python + ": 'import " + imports + "' did not finish in 120 s";
    } else if (r.code == 3) {
      reason = python + " has torch " + last_line(r.err) + ", not 2.x" + hint;
    } else if (r.code != 0) {
      reason = python + ": 'import " + imports + "' failed (exit " + std::to_string(r.code) +
               "): " + last_line(r.err) + hint;
    }
  }
  reasons[module] = reason;
  return reason;
}

}  // namespace ddp::testing
