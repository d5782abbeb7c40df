#pragma once
// ProcessGroup: a set of ranks and the collectives among them, over one
// backend ("shm": shared memory among the ranks of a node plus Gloo across
// nodes; "gloo" on CPU over TCP; "nccl" on GPU; "local" for a world of one).
//
// Buffers are contiguous: (pointer, element count, dtype). For NCCL they are
// device pointers (see allocate()). Every collective has a blocking form and
// an async form returning a Work; collectives run one at a time, in the order
// they were issued, on the group's own thread, so every rank must issue the
// same collectives in the same order (DDP_DEBUG=1 checks that and reports the
// ranks that differ instead of hanging). Each collective is bounded by the
// group's timeout; on timeout the error names the collective, its size, and
// the ranks that had not arrived (asked through the store).
//
// Thread-safety: issuing collectives from several threads is allowed; their
// order is the order the calls reach the group. Errors are ddp::Error.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/common/error.h"  // ddp::Error, what every call here throws
#include "ddp/store.h"
#include "ddp/types.h"
#include "ddp/work.h"

namespace ddp {

struct ProcessGroupOptions {
  std::string backend = "gloo";                                 // shm | gloo | nccl | local
  std::chrono::milliseconds timeout = std::chrono::minutes(5);  // per collective
  // How long creating the group waits for peers on other machines to
  // connect (Gloo), for its shm segment, or for its NCCL communicator to
  // form; 0: `timeout`. Shorter for a group rebuilt over members
  // that had all arrived (ddp::Healer): one that dies meanwhile fails the
  // creation soon instead of after `timeout`.
  std::chrono::milliseconds connect_timeout{0};
  bool debug_checks = false;       // compare every collective's signature across ranks first
  int device = 0;                  // CUDA device for nccl
  std::string host = "127.0.0.1";  // this rank's address for peer traffic (gloo)
  // For shm: where this rank sits. Ranks of a node are consecutive (rank -
  // local_rank is the node's first). local_size 0: every rank is on one node.
  int local_rank = 0;
  int local_size = 0;
  int node = 0;   // this node's index
  int nodes = 1;  // number of nodes
  // For shm: names the node's segment, /dev/shm/ddp-<run_id>-r<round>-<group_name>-...
  // (ddprun removes its run's segments when a job ends). Empty run_id: "anon<pid>".
  std::string run_id;
  long round = 0;
  std::string group_name = "default";
  // For shm: which algorithm variants its collectives use, in DDP_SHM_ALGO's
  // syntax (e.g. "pull", "all_reduce=chunked,broadcast=push"); empty: the
  // variable, and without it each is chosen by timing (docs/cli.md).
  std::string shm_algorithm;
  // For shm: the bytes of each rank's chunk slot, through which private
  // buffers are copied in a pipeline (rounded up to 4 KiB, at least 64 KiB);
  // 0: DDP_SHM_CHUNK_KB, else 256 KiB. The rank that creates the node's
  // segment decides for the node. Larger chunks mean fewer synchronisations
  // per byte: ddp::Healer moves a state of 64 MiB or more with 1 MiB chunks.
  std::size_t shm_chunk_bytes = 0;
  // For shm: this rank's arena (where allocate() takes its blocks) is not
  // made inside the group's segment but carried by the process from one
  // such group to the next: a file of its own, named under run_id in
  // /dev/shm while the process lives (removed at exit; ddprun hands a dead
  // worker's to the process it relaunches in its place, and removes every
  // file of its run when the job ends). A block taken in a later group reuses the pages an earlier
  // group's blocks had, instead of fresh pages the kernel must zero, and a
  // group's end frees no pages. What a group rebuilt after every failure
  // wants (ddp::Healer sets it): for a model of 1 GiB the new epoch's
  // gradient buckets are then ready in a fraction of the time. The arena's
  // pages stay until the process exits. A process's groups with this option
  // share one arena (DDP_SHM_ARENA_MB, sparse); one whose geometry differs
  // keeps its arena in its segment. A rank alone on its node (a world of one
  // included) has no segment but still takes allocate()'s blocks from it.
  bool shm_carry_arena = false;

  // Defaults with another backend: ProcessGroupOptions::of("local").
  static ProcessGroupOptions of(std::string backend_name) {
    ProcessGroupOptions options;
    options.backend = std::move(backend_name);
    return options;
  }
};

// Who a group is made of, for groups rebuilt over the live ranks after a
// failure (live recovery, ddp/heal.h). A member is known by its id, the
// launch rank (RANK) it was started as; a relaunched process keeps its id.
struct Member {
  int id = 0;
  int node = 0;  // its node's index (GROUP_RANK); ranks of a node must be consecutive
  bool operator==(const Member&) const = default;
};

// The members of one epoch of a group. A group is made from one MemberSet
// and never changes; after a failure the survivors (and any arrivals) make a
// new group from the next epoch's set. Rank i of that group is members[i].
struct MemberSet {
  std::uint64_t epoch = 0;      // 0: the launch's group; each rebuild adds at least one
  std::vector<Member> members;  // in rank order: by node, then id; ids unique

  int size() const { return static_cast<int>(members.size()); }
  // The rank of member `id` in this set; -1 when it is not in it.
  int rank_of(int id) const;
  // "0 1 3" (the ids, in rank order).
  std::string describe() const;
};

class Backend;
class Executor;
namespace detail {
struct Collective;
class PeerCheck;
class LostNodes;
}  // namespace detail

class ProcessGroup {
 public:
  // Connects `size` ranks through `store` (keys are scoped by the caller).
  // Blocks until every rank has connected or the timeout passes. A group of
  // one needs no store and runs the local backend, except "nccl", which
  // makes a NCCL communicator of one on options.device (the unique id goes
  // through `store`, or one in memory when it is null).
  // A group of several ranks (any backend but local) sets SIGPIPE to ignored
  // when it still has its default action, as Python does at start-up: Gloo's
  // socket writes raise it when a peer has exited, which would otherwise kill
  // this rank instead of failing the collective with an error naming the peer.
  // A disposition the program chose itself is left alone (it must then not
  // terminate on SIGPIPE for that error to be seen).
  static std::shared_ptr<ProcessGroup> create(int rank, int size, std::shared_ptr<Store> store,
                                              const ProcessGroupOptions& options);
  // Rebuilding: a group over `members` in which this process is member
  // `self_id`. Rank, size and (for shm) each rank's node and local rank come
  // from the set; options.local_rank/local_size/node/nodes are ignored. The
  // epoch scopes everything the group makes: its keys in `store`
  // ("e<epoch>/...") and its shm segment (group name "<name>-e<epoch>"), so
  // a group of epoch N+1 never meets what epoch N left behind, and the old
  // group may still exist (aborted) while the new one forms. Every member
  // must call this with an identical set. Throws ddp::Error when `self_id`
  // is not a member, the ids repeat, or a node's members are not consecutive.
  static std::shared_ptr<ProcessGroup> create(const MemberSet& members, int self_id,
                                              std::shared_ptr<Store> store,
                                              const ProcessGroupOptions& options);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& backend_name() const { return options_.backend; }
  std::chrono::milliseconds timeout() const { return options_.timeout; }
  // What the group was made from: the set given to create(), or for a group
  // made by rank and size, epoch 0 with member i = rank i (node 0 for all).
  const MemberSet& members() const { return members_; }
  std::uint64_t epoch() const { return members_.epoch; }

  // This rank leaves the group, for good: peers waiting on it in a
  // collective fail at once instead of at the timeout (shm: within
  // milliseconds; gloo and nccl: when this group is destroyed, which closes
  // its connections), and every collective this rank has queued or issues
  // later fails with an error saying the group was aborted. A survivor calls
  // it on the old group before agreeing on the next member set. Does not
  // wait; thread-safe; idempotent.
  void abort();
  bool aborted() const;

  // Throws ddp::Error, as a collective would, when this group can no longer
  // complete a collective for a reason known without communicating: a
  // member's process on this node has exited, some member aborted the group
  // (asked of the store, at most every second, only when the group spans
  // several nodes), or this rank did. Otherwise returns. For the pauses of
  // a long step (after the forward pass, between layers): a step that
  // cannot commit stops there instead of at its next collective, which may
  // be a whole forward and backward pass away. A member on another node
  // that died without aborting is not seen here (its collectives time
  // out). Cheap: it looks at most every 10 ms (a poll per member on this
  // node, a microsecond each) and returns at once otherwise, or while
  // another thread looks. Once it has thrown for a peer, every later call
  // throws the same at once (a member gone stays gone from this epoch).
  // Thread-safe.
  void check_peers();

  // data[i] = op over ranks of data[i]. kAvg divides the sum by size()
  // (integer types: truncating division).
  void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op = ReduceOp::kSum);
  std::shared_ptr<Work> all_reduce_async(void* data, std::size_t count, DType dtype,
                                         ReduceOp op = ReduceOp::kSum);
  // An all_reduce after which only the elements in `needed` (this rank's
  // list; ranks may pass different, overlapping or empty lists) are
  // guaranteed to hold the result; the rest of `data` is unspecified. For
  // ZeRO-style sharding, where each rank reads only what it updates: with
  // shm and every rank's `data` from allocate(), each rank reduces just its
  // elements into its own buffer, reading the others' (about half the memory
  // traffic of an all-reduce on one node); elsewhere a full all_reduce. The
  // results are the same bits all_reduce gives. `needed` is copied.
  void all_reduce_partial(void* data, std::size_t count, DType dtype, ReduceOp op,
                          const std::vector<ElementRange>& needed);
  std::shared_ptr<Work> all_reduce_partial_async(void* data, std::size_t count, DType dtype,
                                                 ReduceOp op,
                                                 const std::vector<ElementRange>& needed);
  // root's data to every rank.
  void broadcast(void* data, std::size_t count, DType dtype, int root);
  std::shared_ptr<Work> broadcast_async(void* data, std::size_t count, DType dtype, int root);
  // The reduction lands in root's data; other ranks' data is left unchanged.
  void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root);
  std::shared_ptr<Work> reduce_async(void* data, std::size_t count, DType dtype, ReduceOp op,
                                     int root);
  // out (size() * count elements) = every rank's `in`, in rank order.
  void all_gather(const void* in, void* out, std::size_t count, DType dtype);
  std::shared_ptr<Work> all_gather_async(const void* in, void* out, std::size_t count, DType dtype);
  // Like all_gather, but only root's `out` is written (others may pass nullptr).
  void gather(const void* in, void* out, std::size_t count, DType dtype, int root);
  std::shared_ptr<Work> gather_async(const void* in, void* out, std::size_t count, DType dtype,
                                     int root);
  // root's `in` (size() * count elements): slice r goes to rank r's `out`.
  void scatter(const void* in, void* out, std::size_t count, DType dtype, int root);
  std::shared_ptr<Work> scatter_async(const void* in, void* out, std::size_t count, DType dtype,
                                      int root);
  // in and out hold size() slices of `count`: slice j of rank i goes to slice i of rank j.
  void all_to_all(const void* in, void* out, std::size_t count, DType dtype);
  std::shared_ptr<Work> all_to_all_async(const void* in, void* out, std::size_t count, DType dtype);
  // in holds size() slices of `count`; out = op over ranks of slice rank().
  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op);
  std::shared_ptr<Work> reduce_scatter_async(const void* in, void* out, std::size_t count,
                                             DType dtype, ReduceOp op);
  void barrier();
  std::shared_ptr<Work> barrier_async();

  // Byte strings of any length.
  void broadcast_object(std::string& bytes, int root);
  std::vector<std::string> all_gather_object(const std::string& bytes);

  // Memory for collective buffers: host memory for gloo and local, device
  // memory for nccl, memory inside the node's shared segment for shm (an
  // all-reduce whose buffers all live there runs in place, without copies;
  // when the segment has no room it warns once and returns private memory).
  // Freed when the last reference goes, which may outlive the group.
  std::shared_ptr<void> allocate(std::size_t bytes);
  // Collective: ONE zeroed block of `bytes` that every rank of the group
  // sees (the same memory, mapped by each) when the group is the ranks of a
  // single node under shm; nullptr otherwise (a world of one, several nodes,
  // another backend, no room), on every rank alike. Writes by one rank are
  // seen by the others after any later collective. The block stays until the
  // group's segment goes, even when every reference is dropped (with
  // shm_carry_arena: until local rank 0's last use of the group ends).
  std::shared_ptr<void> allocate_node_shared(std::size_t bytes);

  // shm: the algorithm variant this group runs `collective` ("all_reduce",
  // "reduce_scatter", "all_gather" or "broadcast") with for calls of `bytes`
  // per rank (their size class) when the buffers are in its segment, and
  // why: e.g. "pull (timed)", "chunked (DDP_SHM_TUNE_FILE)", "push (forced)".
  // Empty while no call of that class has run, and for other backends and
  // groups spanning several nodes. The same on every rank. Thread-safe.
  std::string algorithm_for(const std::string& collective, std::size_t bytes) const;

 private:
  ProcessGroup(int rank, int size, std::shared_ptr<Store> store, const ProcessGroupOptions& options,
               MemberSet members);
  // Queued for the group's thread (async calls), or run on the caller's
  // thread when the group is idle (blocking calls: saves two thread hand-offs).
  enum class Issue { kQueued, kHereIfIdle };
  std::shared_ptr<Work> submit(detail::Collective call, Issue how);
  void check_signature(const detail::Collective& call);
  std::string missing_ranks(std::uint64_t sequence);

  int rank_;
  int size_;
  std::shared_ptr<Store> store_;
  ProcessGroupOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Executor> executor_;
  std::uint64_t issued_ = 0;  // collectives issued (guarded by the executor's queue lock)
  MemberSet members_;
  std::shared_ptr<std::atomic<bool>> aborted_;
  std::unique_ptr<detail::PeerCheck> peer_check_;  // check_peers()
  std::unique_ptr<detail::LostNodes> lost_nodes_;  // missing_ranks(); null but under heal
};

}  // namespace ddp
