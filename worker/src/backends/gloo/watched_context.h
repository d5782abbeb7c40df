#pragma once
// A Gloo context whose waits end when they can no longer complete
// (internal to the Gloo backend).
//
// Gloo 0.5 fails a connection's pending operations when the connection
// breaks, except the send (or receive) whose bytes are already moving: a
// peer that exits mid-transfer leaves that wait to the collective timeout.
// Here every unbound buffer a collective creates is watched: a wait that has
// lasted 20 ms while every operation it could complete with involves a peer
// `gone` names, or any wait after abandon_all(), throws gloo::IoException
// saying why (within about 40 ms of the wait's start, the watcher looking
// every 20 ms, and every 10 ms at a long wait, so as not to take the cores
// from the collectives). Collectives then fail as when a peer's socket closes.
//
// Thread-safety: abandon_all() may be called from any thread; `gone` is
// called on the watcher's own thread only; the rest on the thread that
// issues collectives.

#include <gloo/rendezvous/context.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace ddp::gloo_watch {

class Watcher;

// Why peer `rank` is gone ("rank 2 (pid 41) exited"), or nullopt while it
// may still take part. Asked every 10 ms or so of a long wait.
using GoneCheck = std::function<std::optional<std::string>(int rank)>;

class WatchedContext final : public gloo::rendezvous::Context {
 public:
  WatchedContext(int rank, int size, GoneCheck gone);
  ~WatchedContext() override;

  // After connectFullMesh: from then on the collectives' buffers are watched.
  void watch();

  // Every wait, now and later, throws gloo::IoException with `why`.
  void abandon_all(const std::string& why);

 private:
  GoneCheck gone_;
  std::shared_ptr<Watcher> watcher_;
};

}  // namespace ddp::gloo_watch
