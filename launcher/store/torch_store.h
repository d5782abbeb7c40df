#pragma once
// TorchStore: a server of torch.distributed's TCPStore protocol
// (torch_store_protocol.h), so that a program's ranks can use the agent's
// store as under torchrun 2.x (TORCHELASTIC_USE_AGENT_STORE=True: every rank
// is a TCPStore client of MASTER_ADDR:MASTER_PORT). It owns no listening
// socket: the rendezvous's ConnectionAcceptor hands it the connections whose
// first byte is a TCPStore query, so gRPC and the store share one port.
//
// Pure socket code: one thread runs an epoll loop over every connection
// (non-blocking, level-triggered), decodes whole queries from a buffer and
// answers them with TorchStoreState (torch_store_state.h: semantics and
// limits). Memory is bounded:
//   - one query, its keys and values together, is at most max_query_bytes
//     (the gRPC server's max_message_bytes); a longer length is refused when
//     it arrives;
//   - a connection whose answers are not read stops being read until they
//     are (so pipelined queries wait in the kernel, not here);
//   - every connection's buffered bytes together are at most
//     limits.max_store_bytes (or twice max_query_bytes, if more): the
//     connection that would pass it is closed;
//   - keys and queues: TorchStoreState.
// A malformed, oversized or unknown query, or one the state refuses, closes
// that connection and logs one line naming the peer and the reason (as
// torch's server closes a connection on an error); the others go on.
//
// Unauthenticated, like torch's own TCPStore: anyone who reaches the port can
// read and write the program's keys (the rendezvous token guards only gRPC).
//
// Thread-safety: adopt(), clear(), num_keys() and stop() may be called from
// any thread, concurrently with the loop; start() once.

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "rendezvous/limits.h"
#include "store/torch_store_state.h"

namespace ddp::launcher {

class TorchStore {
 public:
  struct Options {
    RendezvousLimits limits;
    std::size_t max_query_bytes = 8u << 20;
  };

  explicit TorchStore(const Options& options);  // throws ddp::Error (epoll, eventfd)
  ~TorchStore();                                // stop()
  TorchStore(const TorchStore&) = delete;
  TorchStore& operator=(const TorchStore&) = delete;

  void start();  // serves on a thread of its own from now on
  // Closes every connection and stops the thread. Idempotent.
  void stop();
  // Takes a connected non-blocking socket whose unread bytes begin with a
  // TCPStore query; owns it from then on (closes it if stopped).
  void adopt(int fd);
  // Drops every key, counter and queue: a new round's workers must not see
  // the last round's (torch 2.x does not prefix the agent store's keys with
  // the restart). Waiting clients go on waiting.
  void clear();
  std::size_t num_keys();

 private:
  struct Connection {
    int fd = -1;
    torch_store::ClientId id = 0;
    std::string peer;
    torch_store::Dialect dialect = torch_store::Dialect::kUnknown;
    std::string in;                      // received, not yet decoded
    std::string out;                     // answers not yet sent
    std::uint32_t watched = 0;           // the epoll events asked for
    std::optional<std::string> closing;  // to be closed: why ("" for the peer's own close)
  };

  void run();
  void take_adopted();
  void handle(torch_store::ClientId id, std::uint32_t events);
  void read_some(Connection& c);
  // Answers the queries `c` has sent while its answers drain.
  void serve(Connection& c);
  // Decodes and answers up to a batch of queries; returns how many.
  std::size_t answer_batch(Connection& c);
  void deliver(std::vector<torch_store::Outgoing>& out);
  void flush(Connection& c);
  void watch(Connection& c);
  void grow(Connection& c, std::size_t bytes);  // counts buffered bytes; dooms c past the limit
  void close_doomed();
  void close_connection(Connection& c);

  const Options options_;
  const torch_store::WireLimits wire_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;

  std::mutex mu_;
  torch_store::TorchStoreState state_;  // guarded by mu_
  std::vector<int> adopted_;            // guarded by mu_
  bool stopping_ = false;               // guarded by mu_

  // The loop's own (its thread only, or after it has stopped).
  std::unordered_map<torch_store::ClientId, Connection> connections_;
  torch_store::ClientId next_id_ = 1;
  std::size_t buffered_ = 0;
  std::vector<torch_store::ClientId> doomed_;
};

}  // namespace ddp::launcher
