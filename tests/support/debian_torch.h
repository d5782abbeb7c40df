#pragma once
// Test support: Debian's python3 with torch, the PyTorch side of our tests
// (the python3 first on PATH may not see it).

#include <string>

namespace ddp::testing {

inline constexpr const char* kDebianPython = "/usr/bin/python3";

// The last non-empty line of `text` (a Python error's own message).
std::string last_line(const std::string& text);

// "" when `import torch` works under kDebianPython, else why not (asked once).
std::string torch_unavailable_reason();

}  // namespace ddp::testing
