#pragma once
// The one error type of ddprun and libddp. Its message always names the thing
// that is wrong (flag, rank, key, endpoint, variable), so callers print it as is.

#include <stdexcept>
#include <string>

namespace ddp {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace ddp
