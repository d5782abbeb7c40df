#pragma once
// Backend: the blocking collectives of one transport (internal). Called from
// the process group's executor thread only, one collective at a time, with
// arguments already validated. Throws ddp::Error (timeouts included).

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/lost_nodes.h"
#include "ddp/common/error.h"
#include "ddp/process_group.h"
#include "ddp/store.h"
#include "ddp/types.h"

namespace ddp {

// A collective failed because a peer's process is gone, and the message
// already names it (so the group need not ask the store who was missing).
class PeerExitedError : public Error {
 public:
  using Error::Error;
};

// Ranks issued different collectives (the debug check, or shm's own check
// among a node's ranks): every rank already knows who differs, so the group
// does not ask the store who was missing.
class CollectiveMismatchError : public Error {
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
  virtual void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype,
                              ReduceOp op) = 0;
  virtual void barrier() = 0;
  virtual std::shared_ptr<void> allocate(std::size_t bytes);
  // ProcessGroup::allocate_node_shared, on the group's rank 0: a zeroed block
  // every rank can reach, as an offset for node_shared_at; -1 when there is none.
  virtual std::int64_t offer_node_shared(std::size_t /*bytes*/) { return -1; }
  // On every rank: the block rank 0 offered at `offset`.
  virtual std::shared_ptr<void> node_shared_at(std::int64_t /*offset*/, std::size_t /*bytes*/) {
    return nullptr;
  }
  // ProcessGroup::abort: peers waiting on this rank stop waiting. Called
  // from any thread, possibly while a collective runs; must not block.
  virtual void abort() {}
  // ProcessGroup::algorithm_for. Called from any thread.
  virtual std::string algorithm_for(const std::string& /*collective*/,
                                    std::size_t /*bytes*/) const {
    return "";
  }
};

// What a backend is made with: the group's options (ProcessGroupOptions),
// with local_rank/local_size resolved (every rank on one node when the
// options leave local_size 0), and the rank, size and store.
struct BackendConfig : ProcessGroupOptions {
  BackendConfig() { local_size = 1; }
  static BackendConfig of(int rank, int size, std::shared_ptr<Store> store,
                          const ProcessGroupOptions& options) {
    BackendConfig config;
    static_cast<ProcessGroupOptions&>(config) = options;
    config.rank = rank;
    config.size = size;
    config.group_store = store;
    config.store = std::move(store);
    if (options.local_size <= 0) {
      config.local_rank = rank;
      config.local_size = size;
    }
    return config;
  }
  int rank = 0;
  int size = 1;
  std::shared_ptr<Store> store;
  // The ProcessGroup's own store, also where a backend's inner groups (with
  // a store of their own) are made: where ProcessGroup::abort() counts the
  // ranks that left ("left_count").
  std::shared_ptr<Store> group_store;
  // The group's nodes the rendezvous leaves out from now on (a group over
  // several nodes under --on_failure=heal), for the waits' PeerWatch.
  std::optional<detail::LostNodes> lost_nodes;
};

// Where a backend's allocate() may take its blocks from instead of private
// memory (Backend::allocate). Thread-safe, as allocate() is.
using Allocator = std::function<std::shared_ptr<void>(std::size_t bytes)>;

// A world of one: its collectives copy or do nothing. `allocate` (empty:
// private memory) is where its allocate() takes blocks from.
std::unique_ptr<Backend> make_local_backend(Allocator allocate = {});
std::unique_ptr<Backend> make_gloo_backend(const BackendConfig& config);
// Shared memory among the ranks of each node, Gloo across nodes and for the
// collectives it does not implement itself.
std::unique_ptr<Backend> make_shm_backend(const BackendConfig& config);
// For a world of one on the shm backend under shm_carry_arena (a healing
// group that shrank to one rank): blocks from the process's carried arena,
// whose pages the process's last group's blocks had, instead of fresh
// private memory the kernel must zero. Empty when the options carry no arena
// (or have no store), or the process's arena has another size. Throws
// ddp::Error naming the file when /dev/shm refuses the arena.
Allocator make_lone_shm_allocator(const BackendConfig& config);
// Throws ddp::Error when this build has no NCCL.
std::unique_ptr<Backend> make_nccl_backend(const BackendConfig& config);

}  // namespace ddp
