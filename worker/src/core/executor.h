#pragma once
// Executor: one thread that runs a process group's collectives in issue order.
// A blocking call may run its collective on the caller's thread instead, when
// nothing is queued or running (run_now_or_post): same order, and it saves
// the two thread hand-offs that dominate a small collective's latency.

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace ddp {

class Executor {
 public:
  Executor() : thread_([this] { loop(); }) {}
  ~Executor() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // `make_task` runs under the queue lock (so sequence numbers follow queue order).
  template <class MakeTask>
  void post(MakeTask&& make_task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(make_task());
    }
    cv_.notify_one();
  }
  // Like post, but runs the task here and now when the executor is idle.
  // Returns true when it ran here.
  template <class MakeTask>
  bool run_now_or_post(MakeTask&& make_task) {
    std::unique_lock<std::mutex> lock(mu_);
    auto task = make_task();
    if (!queue_.empty() || busy_) {
      queue_.push_back(std::move(task));
      lock.unlock();
      cv_.notify_one();
      return false;
    }
    busy_ = true;
    lock.unlock();
    task();  // tasks catch their own exceptions
    lock.lock();
    busy_ = false;
    bool more = !queue_.empty();
    lock.unlock();
    if (more) cv_.notify_one();
    return true;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || (!queue_.empty() && !busy_); });
      if (queue_.empty()) return;  // stopping, and everything issued has run
      auto task = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      task();
      lock.lock();
      busy_ = false;
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  bool busy_ = false;  // a task is running (here or on a caller's thread)
  std::thread thread_;
};

}  // namespace ddp
