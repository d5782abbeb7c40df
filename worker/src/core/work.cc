#include "ddp/work.h"

namespace ddp {

bool Work::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (timeout.count() < 0) {
    cv_.wait(lock, [this] { return done_; });
  } else if (!cv_.wait_for(lock, timeout, [this] { return done_; })) {
    return false;
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool Work::is_completed() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void Work::on_finish(std::function<void(std::exception_ptr)> callback) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!finishing_) {
    on_finish_ = std::move(callback);
    return;
  }
  std::exception_ptr error = error_;
  lock.unlock();
  callback(error);
}

void Work::finish(std::exception_ptr error) {
  std::function<void(std::exception_ptr)> callback;
  {
    std::lock_guard<std::mutex> lock(mu_);
    finishing_ = true;  // a callback set from now on runs at once
    error_ = error;
    callback = std::move(on_finish_);
  }
  // Before the waiters wake: a copy-back the callback does is done when wait() returns.
  if (callback) callback(error);
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
}

}  // namespace ddp
