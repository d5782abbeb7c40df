#include "observe/event_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ddp/common/error.h"
#include "ddp/common/launcher_log.h"

namespace ddp::launcher {

std::int64_t wall_clock_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

EventLog::EventLog(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("--events_file=" + path + ": " + std::strerror(errno));
  thread_ = std::thread([this] { loop(); });
}

EventLog::~EventLog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) ::close(fd_);
}

void EventLog::post(const EventRecord& record) {
  std::string line = format_event(record);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() >= kMaxQueued) {
      ++dropped_;
      return;
    }
    queue_.push_back(std::move(line));
  }
  cv_.notify_one();
}

std::uint64_t EventLog::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

void EventLog::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty() && stop_) return;
    std::string batch;
    while (!queue_.empty()) {
      batch += queue_.front();
      queue_.pop_front();
    }
    lock.unlock();
    // One write per batch: O_APPEND keeps each batch whole against other writers.
    std::size_t done = 0;
    int err = 0;
    while (done < batch.size()) {
      const ssize_t n = ::write(fd_, batch.data() + done, batch.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        err = n < 0 ? errno : EIO;
        break;
      }
      done += static_cast<std::size_t>(n);
    }
    lock.lock();
    if (err != 0 && !failed_) {
      failed_ = true;
      launcher_log().warn("writing the event log {} failed ({}); the job goes on, events are lost",
                          path_, std::strerror(err));
    }
  }
}

}  // namespace ddp::launcher
