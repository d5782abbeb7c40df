#pragma once
// Test support: the message of the ddp::Error a call throws.

#include <functional>
#include <string>

#include "ddp/common/error.h"

namespace ddp::testing {

// The message of the ddp::Error `f` throws, or "(no error)". Other exceptions
// pass through (and fail the test).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace ddp::testing
