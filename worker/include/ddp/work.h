#pragma once
// Work: the handle of an asynchronous collective, made by a ProcessGroup and
// completed by it alone. Thread-safe.

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
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
  // Calls `callback` once the collective has finished, with its error (null
  // when it succeeded): at once on this thread when it already has, else on
  // the thread that finishes it (the group's), before wait() returns there.
  // For completion-driven callers (a future to complete, a copy-back). One
  // callback per Work: a second call replaces a first that has not run. The
  // callback must not block on this group's collectives (it runs on the
  // group's thread) and must not throw.
  void on_finish(std::function<void(std::exception_ptr)> callback);
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
  bool finishing_ = false;  // the error is known; the callback may be running
  bool done_ = false;
  std::exception_ptr error_;
  std::function<void(std::exception_ptr)> on_finish_;
};

}  // namespace ddp
