#pragma once
// Small text helpers the command-line readers share.

#include <string>

namespace ddp::launcher {

// `s` without leading and trailing spaces, tabs and carriage returns.
inline std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\r");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t\r") - first + 1);
}

}  // namespace ddp::launcher
