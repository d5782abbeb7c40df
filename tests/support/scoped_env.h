#pragma once
// Test support: an environment variable set (or unset) for one scope, then
// restored as it was. Not thread-safe: like setenv(3) itself.

#include <cstdlib>
#include <optional>
#include <string>

namespace ddp::testing {

class ScopedEnv {
 public:
  // `value` nullopt: the variable is unset for the scope.
  ScopedEnv(const char* name, const std::optional<std::string>& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace ddp::testing
