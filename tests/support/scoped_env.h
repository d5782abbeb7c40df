#pragma once
// Test support: an environment variable set (or unset) for one scope, then
// restored as it was. Not thread-safe: like setenv(3) itself.

#include <cstdlib>
#include <deque>
#include <map>
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

// Several variables for one scope, each restored as ScopedEnv restores one.
class ScopedEnvs {
 public:
  explicit ScopedEnvs(const std::map<std::string, std::string>& values) {
    for (const auto& [name, value] : values) vars_.emplace_back(name.c_str(), value);
  }

 private:
  std::deque<ScopedEnv> vars_;
};

}  // namespace ddp::testing
