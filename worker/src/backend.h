#pragma once
// Backend: the blocking collectives of one transport (internal). Called from
// the process group's executor thread only, one collective at a time, with
// arguments already validated. Throws ddp::Error (timeouts included).

#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/store.h"
#include "ddp/types.h"

namespace ddp {

// A collective failed because a peer's process is gone, and the message
// already names it (so the group need not ask the store who was missing).
class PeerExitedError : public Error {
 public:
  using Error::Error;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) = 0;
  // ProcessGroup::all_reduce_partial; a full all_reduce unless the backend has a cheaper way.
  virtual void all_reduce_partial(void* data, std::size_t count, DType dtype, ReduceOp op,
                                  const std::vector<ElementRange>& /*needed*/) {
    all_reduce(data, count, dtype, op);
  }
  virtual void broadcast(void* data, std::size_t count, DType dtype, int root) = 0;
  virtual void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) = 0;
  virtual void all_gather(const void* in, void* out, std::size_t count, DType dtype) = 0;
  virtual void gather(const void* in, void* out, std::size_t count, DType dtype, int root) = 0;
  virtual void scatter(const void* in, void* out, std::size_t count, DType dtype, int root) = 0;
  virtual void all_to_all(const void* in, void* out, std::size_t count, DType dtype) = 0;
  virtual void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op) = 0;
  virtual void barrier() = 0;
  virtual std::shared_ptr<void> allocate(std::size_t bytes);
  // ProcessGroup::allocate_node_shared, on the group's rank 0: a zeroed block
  // every rank can reach, as an offset for node_shared_at; -1 when there is none.
  virtual std::int64_t offer_node_shared(std::size_t /*bytes*/) { return -1; }
  // On every rank: the block rank 0 offered at `offset`.
  virtual std::shared_ptr<void> node_shared_at(std::int64_t /*offset*/, std::size_t /*bytes*/) { return nullptr; }
};

struct BackendConfig {
  int rank = 0;
  int size = 1;
  std::shared_ptr<Store> store;
  std::chrono::milliseconds timeout{300000};
  int device = 0;
  std::string host = "127.0.0.1";  // address peers reach this rank at (Gloo listens there)
  // Where the rank sits (shm backend): its index among the ranks of its node,
  // their count, the node's index and the number of nodes. Ranks of one node
  // are consecutive: global rank = rank - local_rank + local index.
  int local_rank = 0;
  int local_size = 1;
  int node = 0;
  int nodes = 1;
  // Names the shm segment (ddp/common/shm_names.h).
  std::string run_id;
  long round = 0;
  std::string group_name = "default";
};

std::unique_ptr<Backend> make_local_backend();
std::unique_ptr<Backend> make_gloo_backend(const BackendConfig& config);
// Shared memory among the ranks of each node, Gloo across nodes and for the
// collectives it does not implement itself.
std::unique_ptr<Backend> make_shm_backend(const BackendConfig& config);
// Throws ddp::Error when this build has no NCCL.
std::unique_ptr<Backend> make_nccl_backend(const BackendConfig& config);

}  // namespace ddp
