#pragma once
// HeartbeatMonitor: a thread that sends this node's heartbeats for one round
// and tells the agent's poll loop (through an eventfd) when the round ended
// elsewhere or the rendezvous server stopped answering for heartbeat_timeout.
// Thread-safe accessors; destruction stops the thread promptly.

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "ddp/common/rendezvous_client.h"

namespace ddp::launcher {

// The node's latest status (a serialized ddp.v1.NodeState), written by the
// control plane's publish() and sent with each heartbeat.
struct StatusSlot {
  std::mutex mu;
  std::string bytes;
  std::string take() {
    std::lock_guard<std::mutex> lock(mu);
    return bytes;
  }
};

class HeartbeatMonitor {
 public:
  HeartbeatMonitor(RendezvousClient& client, std::int64_t round, int group_rank,
                   std::chrono::milliseconds interval, std::chrono::milliseconds timeout,
                   std::shared_ptr<StatusSlot> status = nullptr);
  ~HeartbeatMonitor();
  HeartbeatMonitor(const HeartbeatMonitor&) = delete;
  HeartbeatMonitor& operator=(const HeartbeatMonitor&) = delete;

  // Readable (poll POLLIN) once ended() or lost() has something to say.
  int event_fd() const { return event_fd_; }
  // The round's status once the server says it ended.
  std::optional<RoundStatus> ended();
  // Why the server is considered gone (empty while it answers).
  std::string lost();
  // Seconds since the server last answered a heartbeat.
  double heartbeat_age_s();

 private:
  void loop();
  RendezvousClient& client_;
  std::int64_t round_;
  int group_rank_;
  std::chrono::milliseconds interval_, timeout_;
  int event_fd_ = -1;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::optional<RoundStatus> ended_;
  std::shared_ptr<StatusSlot> status_;
  std::chrono::steady_clock::time_point last_ok_ = std::chrono::steady_clock::now();
  std::string lost_;
  CallCanceller canceller_;
  std::thread thread_;
};

}  // namespace ddp::launcher
