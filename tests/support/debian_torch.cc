#include "debian_torch.h"

#include <chrono>

#include "subprocess.h"

namespace ddp::testing {

std::string last_line(const std::string& text) {
  auto end = text.find_last_not_of("\n");
  if (end == std::string::npos) return "(no output)";
  auto start = text.rfind('\n', end);
  return text.substr(start == std::string::npos ? 0 : start + 1,
                     end - (start == std::string::npos ? 0 : start + 1) + 1);
}

std::string torch_unavailable_reason() {
  static const std::string reason = [] {
    auto r = run_process({kDebianPython, "-c", "import torch"}, {}, std::chrono::seconds(120));
    if (r.exited && r.code == 0) return std::string();
    return std::string(kDebianPython) + " -c 'import torch' failed (exit " +
           std::to_string(r.code) + "): " + last_line(r.err);
  }();
  return reason;
}

}  // namespace ddp::testing
