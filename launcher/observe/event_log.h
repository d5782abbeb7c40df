#pragma once
// EventLog: appends event records (event_record.h) to --events_file from a
// writer thread of its own, so the agent never waits for the disk: post()
// only queues (a bounded queue; when full, the record is dropped and
// counted). A failed write (a full disk) is reported once on ddprun's
// stderr and the job goes on; later records are still tried. Destruction
// writes what is queued (bounded by the flush timeout) and stops the thread.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "observe/event_record.h"

namespace ddp::launcher {

class EventLog {
 public:
  static constexpr std::size_t kMaxQueued = 4096;
  // Opens `path` for appending (created 0644); throws ddp::Error naming it.
  explicit EventLog(const std::string& path);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  void post(const EventRecord& record);  // never blocks on I/O
  std::uint64_t dropped() const;

 private:
  void loop();
  std::string path_;
  int fd_ = -1;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  bool stop_ = false;
  bool failed_ = false;  // a write failed (said once)
  std::uint64_t dropped_ = 0;
  std::thread thread_;
};

// Milliseconds since the epoch, now.
std::int64_t wall_clock_ms();

}  // namespace ddp::launcher
