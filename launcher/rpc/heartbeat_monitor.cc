#include "rpc/heartbeat_monitor.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include "ddp/common/error.h"

namespace ddp::launcher {

HeartbeatMonitor::HeartbeatMonitor(RendezvousClient& client, std::int64_t round, int group_rank,
                                   std::chrono::milliseconds interval,
                                   std::chrono::milliseconds timeout,
                                   std::shared_ptr<StatusSlot> status)
    : client_(client),
      round_(round),
      group_rank_(group_rank),
      interval_(interval),
      timeout_(timeout),
      status_(std::move(status)) {
  event_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (event_fd_ < 0) throw Error("heartbeat: eventfd failed");
  thread_ = std::thread([this] { loop(); });
}

HeartbeatMonitor::~HeartbeatMonitor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  canceller_.cancel();  // a held heartbeat in flight
  cv_.notify_all();
  thread_.join();
  close(event_fd_);
}

std::optional<RoundStatus> HeartbeatMonitor::ended() {
  std::lock_guard<std::mutex> lock(mu_);
  return ended_;
}

double HeartbeatMonitor::heartbeat_age_s() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - last_ok_).count();
}

std::string HeartbeatMonitor::lost() {
  std::lock_guard<std::mutex> lock(mu_);
  return lost_;
}

void HeartbeatMonitor::loop() {
  using Clock = std::chrono::steady_clock;
  auto last_ok = Clock::now();
  std::string last_error;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    std::optional<RoundStatus> status;
    const auto sent = Clock::now();
    try {
      // The server holds the answer for up to an interval and answers at once
      // when the round ends; beyond that one RPC may take at most another
      // interval, so a hung server is noticed in time.
      status = client_.heartbeat(round_, group_rank_,
                                 std::max(interval_, std::chrono::milliseconds(200)), interval_,
                                 &canceller_, status_ ? status_->take() : std::string());
      last_ok = Clock::now();
    } catch (const RpcError& e) {
      last_error = e.what();
    }
    lock.lock();
    if (status) last_ok_ = last_ok;
    if (stop_) break;
    if (status && status->round_ended) {
      lock.unlock();
      // Before the agent hears it (and may exit): the host waits for this.
      client_.acknowledge_end(round_, group_rank_,
                              std::max(interval_, std::chrono::milliseconds(200)));
      lock.lock();
      ended_ = status;
      break;
    }
    if (!status && Clock::now() - last_ok >= timeout_) {
      lost_ = "lost the rendezvous server " + client_.endpoint() + " (no answer for " +
              std::to_string(timeout_.count() / 1000.0).substr(0, 5) + " s): " + last_error;
      break;
    }
    // After a held answer this is due already; a server that answered at
    // once (or an error) waits out the rest of the interval.
    cv_.wait_until(lock, sent + interval_, [this] { return stop_; });
  }
  if (ended_ || !lost_.empty()) {
    uint64_t one = 1;
    ssize_t ignored = write(event_fd_, &one, sizeof(one));
    (void)ignored;
  }
}

}  // namespace ddp::launcher
