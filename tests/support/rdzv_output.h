#pragma once
// Reading what test_worker's "rdzv" mode prints through ddprun's rank prefix.

#include <set>
#include <string>

#include "subprocess.h"

namespace ddp::testing {

// The global ranks whose worker printed "RDZV OK rank=N ..." in `out`.
inline std::set<int> ranks_ok(const std::string& out) {
  std::set<int> ranks;
  for (const auto& line : lines_with_prefix(out, "[rank ")) {
    auto pos = line.find("RDZV OK rank=");
    if (pos != std::string::npos) ranks.insert(std::stoi(line.substr(pos + 13)));
  }
  return ranks;
}

}  // namespace ddp::testing
