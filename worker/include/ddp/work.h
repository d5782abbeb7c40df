#pragma once
// Work: the handle of an asynchronous collective. Thread-safe.

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>

namespace ddp {

class Work {
 public:
  explicit Work(std::string description) : description_(std::move(description)) {}

  // Blocks until the collective finished or `timeout` passed. Returns true
  // when it finished; throws the collective's ddp::Error if it failed.
  // A negative timeout waits without limit (the collective has its own).
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));
  bool is_completed();
  // "all_reduce of 1024 float32 (sum)"
  const std::string& description() const { return description_; }

  // For the executor: marks the work done, with an error or not.
  void finish(std::exception_ptr error = nullptr);

 private:
  std::string description_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace ddp
