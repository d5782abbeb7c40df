#pragma once
// Work: the handle of an asynchronous collective, made by a ProcessGroup and
// completed by it alone. Thread-safe.

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>

namespace ddp {

class ProcessGroup;

class Work {
 public:
  // Blocks until the collective finished or `timeout` passed. Returns true
  // when it finished; throws the collective's ddp::Error if it failed.
  // A negative timeout waits without limit (the collective has its own).
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));
  bool is_completed();
  // "all_reduce of 1024 float32 (sum)"
  const std::string& description() const { return description_; }

  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

 private:
  friend class ProcessGroup;
  explicit Work(std::string description) : description_(std::move(description)) {}
  // Marks the work done, with an error or not (the group's executor).
  void finish(std::exception_ptr error = nullptr);

  std::string description_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace ddp
