#include "backends/gloo/watched_context.h"

#include <gloo/common/error.h>
#include <gloo/transport/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace ddp::gloo_watch {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A wait may be this old before its peers are asked about: a completion Gloo
// already counted is taken within microseconds of the wait's start, so a
// wait this long is waiting for bytes, not for its thread to run.
constexpr auto kLongWait = 20ms;
// How often the watcher looks: rarely while no wait is long (it must not take
// the cores from the collectives it watches), often once one is.
constexpr auto kLookRarely = kLongWait;
constexpr auto kLookOften = 10ms;

class WatchedBuffer;

// The live buffers of one context, and the thread that looks at them while
// one of them waits: every 20 ms, and every 10 ms while a wait is long.
class Watcher {
 public:
  explicit Watcher(GoneCheck gone) : gone_(std::move(gone)) {
    thread_ = std::thread([this] { run(); });
  }
  ~Watcher() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void add(WatchedBuffer* buffer);
  void remove(WatchedBuffer* buffer);
  void wait_begins() {
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(m_);
      wake = ++waiting_ == 1 && idle_;  // a busy watcher looks again soon anyway
    }
    if (wake) cv_.notify_all();
  }
  void wait_ends() {
    std::lock_guard<std::mutex> lock(m_);
    --waiting_;
  }
  void abandon_all(const std::string& why);

 private:
  void run();

  GoneCheck gone_;
  std::mutex m_;
  std::condition_variable cv_;
  std::set<WatchedBuffer*> live_;
  std::optional<std::string> abandoned_;
  int waiting_ = 0;
  bool idle_ = false;  // asleep until a wait begins
  bool stop_ = false;
  std::thread thread_;
};

// Gloo's own buffer, with the operations it has not been seen to complete.
class WatchedBuffer final : public gloo::transport::UnboundBuffer {
 public:
  WatchedBuffer(std::unique_ptr<gloo::transport::UnboundBuffer> gloo_buffer, Watcher& watcher)
      : gloo::transport::UnboundBuffer(gloo_buffer->ptr, gloo_buffer->size),
        gloo_(std::move(gloo_buffer)),
        watcher_(watcher) {
    watcher_.add(this);
  }
  ~WatchedBuffer() override { watcher_.remove(this); }

  void send(int peer, uint64_t slot, size_t offset, size_t nbytes) override {
    issue(sends_, {peer}, [&] { gloo_->send(peer, slot, offset, nbytes); });
  }
  void recv(int peer, uint64_t slot, size_t offset, size_t nbytes) override {
    issue(recvs_, {peer}, [&] { gloo_->recv(peer, slot, offset, nbytes); });
  }
  void recv(std::vector<int> peers, uint64_t slot, size_t offset, size_t nbytes) override {
    issue(recvs_, peers, [&] { gloo_->recv(peers, slot, offset, nbytes); });
  }
  bool waitSend(int* rank, std::chrono::milliseconds timeout) override {
    return wait(sends_, rank, [&](int* who) { return gloo_->waitSend(who, timeout); });
  }
  bool waitRecv(int* rank, std::chrono::milliseconds timeout) override {
    return wait(recvs_, rank, [&](int* who) { return gloo_->waitRecv(who, timeout); });
  }
  void abortWaitSend() override { gloo_->abortWaitSend(); }
  void abortWaitRecv() override { gloo_->abortWaitRecv(); }

  // Ends the current wait, and every later one, with `why`.
  void abandon(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(m_);
      if (!why_) why_ = why;
    }
    gloo_->abortWaitSend();
    gloo_->abortWaitRecv();
  }

  // The peers of the wait in progress, when it is older than kLongWait.
  std::vector<int> long_wait_peers(Clock::time_point now) {
    std::vector<int> peers;
    std::lock_guard<std::mutex> lock(m_);
    if (!waits_long(now)) return peers;
    for (const auto& op : *waiting_on_) peers.insert(peers.end(), op.begin(), op.end());
    return peers;
  }

  // For a wait older than kLongWait whose every operation (every peer it
  // could complete with) involves a gone peer: why it cannot complete.
  std::optional<std::string> stuck(Clock::time_point now, const GoneCheck& gone) {
    Ops ops;
    const char* what = nullptr;
    {
      std::lock_guard<std::mutex> lock(m_);
      if (!waits_long(now)) return std::nullopt;
      ops = *waiting_on_;
      what = waiting_on_ == &sends_ ? "a send to" : "a receive from";
    }
    std::optional<std::string> first;
    for (const auto& peers : ops) {
      for (int peer : peers) {
        auto why = gone(peer);
        if (!why) return std::nullopt;  // this operation may still complete
        if (!first) {
          first = "gloo: " + std::string(what) + " rank " + std::to_string(peer) +
                  " cannot complete: " + *why;
        }
      }
    }
    return first;
  }

 private:
  using Ops = std::vector<std::vector<int>>;  // each: the peers it may complete with

  // Under m_: whether a wait is in progress and older than kLongWait.
  bool waits_long(Clock::time_point now) const {
    return waiting_on_ != nullptr && now - wait_began_ >= kLongWait;
  }

  template <class Issue>
  void issue(Ops& ops, std::vector<int> peers, Issue&& call) {
    {
      std::lock_guard<std::mutex> lock(m_);
      ops.push_back(std::move(peers));
    }
    try {
      call();
    } catch (...) {
      std::lock_guard<std::mutex> lock(m_);
      ops.pop_back();
      throw;
    }
  }

  template <class Wait>
  bool wait(Ops& ops, int* rank, Wait&& gloo_wait) {
    {
      std::lock_guard<std::mutex> lock(m_);
      waiting_on_ = &ops;
      wait_began_ = Clock::now();
    }
    watcher_.wait_begins();
    int who = -1;
    bool done = false;
    try {
      done = gloo_wait(&who);
    } catch (...) {
      end_wait(ops, -1);
      throw;
    }
    end_wait(ops, done ? who : -1);
    if (!done) {
      std::lock_guard<std::mutex> lock(m_);
      throw gloo::IoException(why_.value_or("gloo: a wait was aborted"));
    }
    if (rank != nullptr) *rank = who;
    return true;
  }

  void end_wait(Ops& ops, int completed_with) {
    {
      std::lock_guard<std::mutex> lock(m_);
      waiting_on_ = nullptr;
      auto it = std::find_if(ops.begin(), ops.end(), [&](const std::vector<int>& peers) {
        return std::find(peers.begin(), peers.end(), completed_with) != peers.end();
      });
      if (it != ops.end()) ops.erase(it);
    }
    watcher_.wait_ends();
  }

  std::unique_ptr<gloo::transport::UnboundBuffer> gloo_;
  Watcher& watcher_;
  std::mutex m_;  // never held while calling into Gloo
  Ops sends_, recvs_;
  const Ops* waiting_on_ = nullptr;  // sends_ or recvs_ while a wait runs
  Clock::time_point wait_began_;
  std::optional<std::string> why_;
};

void Watcher::add(WatchedBuffer* buffer) {
  std::optional<std::string> why;
  {
    std::lock_guard<std::mutex> lock(m_);
    live_.insert(buffer);
    why = abandoned_;
  }
  if (why) buffer->abandon(*why);
}

void Watcher::remove(WatchedBuffer* buffer) {
  std::lock_guard<std::mutex> lock(m_);
  live_.erase(buffer);
}

void Watcher::abandon_all(const std::string& why) {
  std::lock_guard<std::mutex> lock(m_);
  if (!abandoned_) abandoned_ = why;
  for (WatchedBuffer* buffer : live_) buffer->abandon(why);
}

void Watcher::run() {
  std::unique_lock<std::mutex> lock(m_);
  auto look = kLookRarely;
  while (!stop_) {
    if (waiting_ == 0) {
      idle_ = true;
      cv_.wait(lock, [&] { return stop_ || waiting_ > 0; });
      idle_ = false;
      look = kLookRarely;
      continue;
    }
    cv_.wait_for(lock, look, [&] { return stop_; });
    if (stop_) break;
    const auto now = Clock::now();
    std::set<int> peers;  // of the long waits
    for (WatchedBuffer* buffer : live_) {
      for (int peer : buffer->long_wait_peers(now)) peers.insert(peer);
    }
    look = peers.empty() ? kLookRarely : kLookOften;
    if (peers.empty()) continue;
    // Asked without the lock (the store may be slow): waits begin and end meanwhile.
    std::map<int, std::optional<std::string>> answers;
    lock.unlock();
    for (int peer : peers) answers[peer] = gone_(peer);
    lock.lock();
    if (stop_) break;
    const GoneCheck gone = [&](int rank) {
      auto it = answers.find(rank);
      return it == answers.end() ? std::nullopt : it->second;
    };
    for (WatchedBuffer* buffer : live_) {
      if (auto why = buffer->stuck(now, gone)) buffer->abandon(*why);
    }
  }
}

namespace {

// Gloo's transport context with watched buffers; everything else is Gloo's.
class WatchedTransport final : public gloo::transport::Context {
 public:
  WatchedTransport(std::shared_ptr<gloo::transport::Context> gloo_context, Watcher& watcher)
      : gloo::transport::Context(gloo_context->rank, gloo_context->size),
        gloo_(std::move(gloo_context)),
        watcher_(watcher) {}
  std::unique_ptr<gloo::transport::Pair>& getPair(int rank) override {
    return gloo_->getPair(rank);
  }
  std::unique_ptr<gloo::transport::Pair>& createPair(int rank) override {
    return gloo_->createPair(rank);
  }
  std::unique_ptr<gloo::transport::UnboundBuffer> createUnboundBuffer(void* ptr,
                                                                      size_t size) override {
    return std::make_unique<WatchedBuffer>(gloo_->createUnboundBuffer(ptr, size), watcher_);
  }

 private:
  std::shared_ptr<gloo::transport::Context> gloo_;
  Watcher& watcher_;
};

}  // namespace

WatchedContext::WatchedContext(int rank, int size, GoneCheck gone)
    : gloo::rendezvous::Context(rank, size), gone_(std::move(gone)) {}

// The transport context (and every buffer) goes before the watcher.
WatchedContext::~WatchedContext() { transportContext_.reset(); }

void WatchedContext::watch() {
  watcher_ = std::make_shared<Watcher>(gone_);
  transportContext_ = std::make_shared<WatchedTransport>(transportContext_, *watcher_);
}

void WatchedContext::abandon_all(const std::string& why) {
  if (watcher_) watcher_->abandon_all(why);
}

}  // namespace ddp::gloo_watch
