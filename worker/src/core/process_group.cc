#include "ddp/process_group.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "core/backend.h"
#include "core/executor.h"
#include "core/lost_nodes.h"
#include "core/peer_check.h"
#include "core/process_identity.h"
#include "core/progress_counter.h"
#include "ddp/common/error.h"

namespace ddp {

namespace detail {

// One issued collective: what it is (for errors and the debug check) and what runs it.
struct Collective {
  const char* name;
  std::size_t count;
  DType dtype;
  int op;    // ReduceOp or -1
  int root;  // or -1
  std::function<void()> run;

  std::string describe() const {
    std::string text = std::string(name);
    if (count > 0 || op >= 0) text += " of " + std::to_string(count) + " " + dtype_name(dtype);
    if (op >= 0) text += " (" + std::string(op_name(static_cast<ReduceOp>(op))) + ")";
    if (root >= 0) text += " from root " + std::to_string(root);
    return text;
  }
};

}  // namespace detail

namespace {

// The debug check's signature of a call, gathered from every rank.
struct Signature {
  std::int64_t name_hash, count, dtype, op, root;
  bool operator==(const Signature&) const = default;
};

std::int64_t hash_name(const char* name) {
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a, in unsigned arithmetic (it wraps)
  for (const char* p = name; *p; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 1099511628211ull;
  return static_cast<std::int64_t>(h);
}

// Gloo writes to its sockets without MSG_NOSIGNAL: a peer that exited would
// kill this rank with SIGPIPE instead of failing the collective with an error
// naming the peer. Python ignores SIGPIPE at start-up, which is why torch's
// Gloo ranks never see it; a C++ program gets the default (terminate), so it
// is ignored here unless the program chose a disposition itself.
void ignore_sigpipe_unless_chosen() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) != 0) return;
  if ((current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace

std::shared_ptr<ProcessGroup> ProcessGroup::create(int rank, int size, std::shared_ptr<Store> store,
                                                   const ProcessGroupOptions& options) {
  if (size < 1) throw Error("process group: size " + std::to_string(size) + " must be >= 1");
  if (rank < 0 || rank >= size) {
    throw Error("process group: rank " + std::to_string(rank) + " is outside [0, " +
                std::to_string(size) + ")");
  }
  MemberSet members;
  for (int r = 0; r < size; ++r) members.members.push_back({r, 0});
  return std::shared_ptr<ProcessGroup>(
      new ProcessGroup(rank, size, std::move(store), options, std::move(members)));
}

ProcessGroup::ProcessGroup(int rank, int size, std::shared_ptr<Store> store,
                           const ProcessGroupOptions& options, MemberSet members)
    : rank_(rank),
      size_(size),
      store_(std::move(store)),
      options_(options),
      members_(std::move(members)),
      aborted_(std::make_shared<std::atomic<bool>>(false)) {
  const std::string& b = options.backend;
  // NCCL in a world of one still exchanges its unique id through a store.
  if (b == "nccl" && size == 1 && !store_) store_ = make_memory_store();
  BackendConfig config = BackendConfig::of(rank, size, store_, options);
  // Counted before connecting: a node left out from now on had ranks in this group.
  config.lost_nodes = detail::LostNodes::of_group(members_);
  if (b != "local" && b != "gloo" && b != "nccl" && b != "shm") {
    throw Error("unknown backend '" + b + "' (expected shm, gloo, nccl or local)");
  }
  if (b != "local" && size > 1 && !store_)
    throw Error("process group: the " + b + " backend needs a store");
  if (b != "local" && size > 1) ignore_sigpipe_unless_chosen();
  if (b == "local" || (size == 1 && b != "nccl")) {
    backend_ = make_local_backend(b == "shm" ? make_lone_shm_allocator(config) : Allocator{});
  } else if (b == "gloo") {
    backend_ = make_gloo_backend(config);
  } else if (b == "shm") {
    backend_ = make_shm_backend(config);
  } else {
    backend_ = make_nccl_backend(config);
  }
  executor_ = std::make_unique<Executor>();
  peer_check_ = std::make_unique<detail::PeerCheck>(store_, rank_, rank_ - config.local_rank,
                                                    config.local_size, size_, config.lost_nodes);
  if (config.lost_nodes) lost_nodes_ = std::make_unique<detail::LostNodes>(*config.lost_nodes);
  // Where this rank runs, so that after a failure the others can tell a dead
  // rank on their machine at once (see missing_ranks).
  if (store_ && size_ > 1) store_->set("proc/" + std::to_string(rank_), detail::process_identity());
}

ProcessGroup::~ProcessGroup() {
  executor_.reset();  // runs what was issued, then stops
  backend_.reset();
}

std::shared_ptr<Work> ProcessGroup::submit(detail::Collective call, Issue how) {
  std::shared_ptr<Work> work(new Work(call.describe()));  // its constructor is the group's alone
  auto make_task = [&]() {
    std::uint64_t sequence = ++issued_;
    return [this, work, call = std::move(call), sequence]() {
      detail::collective_begun(call.name);
      try {
        if (aborted()) {
          throw PeerExitedError("this rank left the group (epoch " +
                                std::to_string(members_.epoch) + ") by aborting it");
        }
        if (options_.debug_checks && size_ > 1) check_signature(call);
        call.run();
        detail::collective_ended();
        work->finish();
      } catch (const std::exception& e) {
        detail::collective_ended();
        std::string message = std::string(e.what());
        // Errors that already say who is at fault need no question to the store.
        const bool names_the_dead = dynamic_cast<const PeerExitedError*>(&e) != nullptr ||
                                    dynamic_cast<const CollectiveMismatchError*>(&e) != nullptr;
        std::string text = "rank " + std::to_string(rank_) + ": " + call.describe() +
                           " (collective #" + std::to_string(sequence) + ") failed: " + message;
        if (store_ && size_ > 1 && !names_the_dead) {
          text += missing_ranks(sequence);
        }
        work->finish(std::make_exception_ptr(Error(text)));
      }
    };
  };
  if (how == Issue::kHereIfIdle) {
    executor_->run_now_or_post(make_task);
  } else {
    executor_->post(make_task);
  }
  return work;
}

void ProcessGroup::abort() {
  if (aborted_->exchange(true)) return;
  backend_->abort();
  // For the peers' failure reports (missing_ranks): this rank left, it is not stuck.
  try {
    if (store_ && size_ > 1) {
      store_->set("left/" + std::to_string(rank_), "1");
      // What the waits of transports that do not notice a departure poll (PeerWatch).
      if (store_->add("left_count", 1) == 1) store_->set("left_first", std::to_string(rank_));
    }
  } catch (const std::exception&) {
  }
}

bool ProcessGroup::aborted() const { return aborted_->load(); }

void ProcessGroup::check_signature(const detail::Collective& call) {
  Signature mine{hash_name(call.name), static_cast<std::int64_t>(call.count),
                 static_cast<std::int64_t>(call.dtype), call.op, call.root};
  std::vector<Signature> all(size_);
  backend_->all_gather(&mine, all.data(), sizeof(Signature) / 8, DType::kInt64);
  // The reference is the signature most ranks have (ties: the lowest rank's),
  // so a lone rank 0 that differs is named, rather than everyone else.
  int reference = 0, most = 0;
  for (int r = 0; r < size_; ++r) {
    int same = static_cast<int>(std::count(all.begin(), all.end(), all[r]));
    if (same > most) {
      most = same;
      reference = r;
    }
  }
  std::string differ;
  for (int r = 0; r < size_; ++r) {
    if (!(all[r] == all[reference])) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  }
  if (differ.empty()) return;
  auto show = [&](int r) {
    const Signature& s = all[r];
    std::string text =
        "count " + std::to_string(s.count) + ", dtype " + dtype_name(static_cast<DType>(s.dtype));
    if (s.op >= 0) text += ", op " + std::string(op_name(static_cast<ReduceOp>(s.op)));
    if (s.root >= 0) text += ", root " + std::to_string(s.root);
    if (s.name_hash != all[reference].name_hash) text += ", a different collective";
    return text;
  };
  int first = std::stoi(differ.substr(0, differ.find(',')));
  throw CollectiveMismatchError("collective mismatch (DDP_DEBUG): rank " +
                                std::to_string(reference) + " has " + show(reference) + " (" +
                                std::to_string(most) + " of " + std::to_string(size_) +
                                " ranks agree); rank(s) " + differ + " differ (rank " +
                                std::to_string(first) + " has " + show(first) + ")");
}

namespace {

// Each collective once: its description and what the group's thread runs;
// the async form queues it, the blocking form may run it on the caller's thread.
using detail::Collective;

void check_root(int root, int size, const char* what) {
  if (root < 0 || root >= size) {
    throw Error(std::string(what) + ": root " + std::to_string(root) + " is outside [0, " +
                std::to_string(size) + ")");
  }
}

Collective all_reduce_op(Backend& b, void* data, std::size_t count, DType dtype, ReduceOp op) {
  return {"all_reduce", count,
          dtype,        static_cast<int>(op),
          -1,           [&b, data, count, dtype, op] { b.all_reduce(data, count, dtype, op); }};
}

Collective all_reduce_partial_op(Backend& b, void* data, std::size_t count, DType dtype,
                                 ReduceOp op, const std::vector<ElementRange>& needed) {
  for (const ElementRange& r : needed) {
    if (r.begin > r.end || r.end > count) {
      throw Error("all_reduce_partial: element range [" + std::to_string(r.begin) + ", " +
                  std::to_string(r.end) + ") is not within the " + std::to_string(count) +
                  " elements");
    }
  }
  return {
      "all_reduce", count, dtype, static_cast<int>(op), -1, [&b, data, count, dtype, op, needed] {
        b.all_reduce_partial(data, count, dtype, op, needed);
      }};
}

Collective broadcast_op(Backend& b, int size, void* data, std::size_t count, DType dtype,
                        int root) {
  check_root(root, size, "broadcast");
  return {"broadcast", count,
          dtype,       -1,
          root,        [&b, data, count, dtype, root] { b.broadcast(data, count, dtype, root); }};
}

Collective reduce_op(Backend& b, int size, void* data, std::size_t count, DType dtype, ReduceOp op,
                     int root) {
  check_root(root, size, "reduce");
  return {"reduce", count,
          dtype,    static_cast<int>(op),
          root,     [&b, data, count, dtype, op, root] { b.reduce(data, count, dtype, op, root); }};
}

Collective all_gather_op(Backend& b, const void* in, void* out, std::size_t count, DType dtype) {
  return {"all_gather", count,
          dtype,        -1,
          -1,           [&b, in, out, count, dtype] { b.all_gather(in, out, count, dtype); }};
}

Collective gather_op(Backend& b, int size, const void* in, void* out, std::size_t count,
                     DType dtype, int root) {
  check_root(root, size, "gather");
  return {"gather", count,
          dtype,    -1,
          root,     [&b, in, out, count, dtype, root] { b.gather(in, out, count, dtype, root); }};
}

Collective scatter_op(Backend& b, int size, const void* in, void* out, std::size_t count,
                      DType dtype, int root) {
  check_root(root, size, "scatter");
  return {"scatter", count,
          dtype,     -1,
          root,      [&b, in, out, count, dtype, root] { b.scatter(in, out, count, dtype, root); }};
}

Collective all_to_all_op(Backend& b, const void* in, void* out, std::size_t count, DType dtype) {
  return {"all_to_all", count,
          dtype,        -1,
          -1,           [&b, in, out, count, dtype] { b.all_to_all(in, out, count, dtype); }};
}

Collective reduce_scatter_op(Backend& b, const void* in, void* out, std::size_t count, DType dtype,
                             ReduceOp op) {
  return {
      "reduce_scatter", count, dtype, static_cast<int>(op), -1, [&b, in, out, count, dtype, op] {
        b.reduce_scatter(in, out, count, dtype, op);
      }};
}

Collective barrier_op(Backend& b) {
  return {"barrier", 0, DType::kUInt8, -1, -1, [&b] { b.barrier(); }};
}

}  // namespace

std::shared_ptr<Work> ProcessGroup::all_reduce_async(void* data, std::size_t count, DType dtype,
                                                     ReduceOp op) {
  return submit(all_reduce_op(*backend_, data, count, dtype, op), Issue::kQueued);
}
void ProcessGroup::all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) {
  submit(all_reduce_op(*backend_, data, count, dtype, op), Issue::kHereIfIdle)->wait();
}

std::shared_ptr<Work> ProcessGroup::all_reduce_partial_async(
    void* data, std::size_t count, DType dtype, ReduceOp op,
    const std::vector<ElementRange>& needed) {
  return submit(all_reduce_partial_op(*backend_, data, count, dtype, op, needed), Issue::kQueued);
}
void ProcessGroup::all_reduce_partial(void* data, std::size_t count, DType dtype, ReduceOp op,
                                      const std::vector<ElementRange>& needed) {
  submit(all_reduce_partial_op(*backend_, data, count, dtype, op, needed), Issue::kHereIfIdle)
      ->wait();
}

std::shared_ptr<Work> ProcessGroup::broadcast_async(void* data, std::size_t count, DType dtype,
                                                    int root) {
  return submit(broadcast_op(*backend_, size_, data, count, dtype, root), Issue::kQueued);
}
void ProcessGroup::broadcast(void* data, std::size_t count, DType dtype, int root) {
  submit(broadcast_op(*backend_, size_, data, count, dtype, root), Issue::kHereIfIdle)->wait();
}

std::shared_ptr<Work> ProcessGroup::reduce_async(void* data, std::size_t count, DType dtype,
                                                 ReduceOp op, int root) {
  return submit(reduce_op(*backend_, size_, data, count, dtype, op, root), Issue::kQueued);
}
void ProcessGroup::reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) {
  submit(reduce_op(*backend_, size_, data, count, dtype, op, root), Issue::kHereIfIdle)->wait();
}

std::shared_ptr<Work> ProcessGroup::all_gather_async(const void* in, void* out, std::size_t count,
                                                     DType dtype) {
  return submit(all_gather_op(*backend_, in, out, count, dtype), Issue::kQueued);
}
void ProcessGroup::all_gather(const void* in, void* out, std::size_t count, DType dtype) {
  submit(all_gather_op(*backend_, in, out, count, dtype), Issue::kHereIfIdle)->wait();
}

std::shared_ptr<Work> ProcessGroup::gather_async(const void* in, void* out, std::size_t count,
                                                 DType dtype, int root) {
  return submit(gather_op(*backend_, size_, in, out, count, dtype, root), Issue::kQueued);
}
void ProcessGroup::gather(const void* in, void* out, std::size_t count, DType dtype, int root) {
  submit(gather_op(*backend_, size_, in, out, count, dtype, root), Issue::kHereIfIdle)->wait();
}

std::shared_ptr<Work> ProcessGroup::scatter_async(const void* in, void* out, std::size_t count,
                                                  DType dtype, int root) {
  return submit(scatter_op(*backend_, size_, in, out, count, dtype, root), Issue::kQueued);
}
void ProcessGroup::scatter(const void* in, void* out, std::size_t count, DType dtype, int root) {
  submit(scatter_op(*backend_, size_, in, out, count, dtype, root), Issue::kHereIfIdle)->wait();
}

std::shared_ptr<Work> ProcessGroup::all_to_all_async(const void* in, void* out, std::size_t count,
                                                     DType dtype) {
  return submit(all_to_all_op(*backend_, in, out, count, dtype), Issue::kQueued);
}
void ProcessGroup::all_to_all(const void* in, void* out, std::size_t count, DType dtype) {
  submit(all_to_all_op(*backend_, in, out, count, dtype), Issue::kHereIfIdle)->wait();
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter_async(const void* in, void* out,
                                                         std::size_t count, DType dtype,
                                                         ReduceOp op) {
  return submit(reduce_scatter_op(*backend_, in, out, count, dtype, op), Issue::kQueued);
}
void ProcessGroup::reduce_scatter(const void* in, void* out, std::size_t count, DType dtype,
                                  ReduceOp op) {
  submit(reduce_scatter_op(*backend_, in, out, count, dtype, op), Issue::kHereIfIdle)->wait();
}

std::shared_ptr<Work> ProcessGroup::barrier_async() {
  return submit(barrier_op(*backend_), Issue::kQueued);
}
void ProcessGroup::barrier() { submit(barrier_op(*backend_), Issue::kHereIfIdle)->wait(); }

void ProcessGroup::broadcast_object(std::string& bytes, int root) {
  std::int64_t length = static_cast<std::int64_t>(bytes.size());
  broadcast(&length, 1, DType::kInt64, root);
  if (rank_ != root) bytes.resize(static_cast<std::size_t>(length));
  broadcast(bytes.data(), bytes.size(), DType::kUInt8, root);
}

std::vector<std::string> ProcessGroup::all_gather_object(const std::string& bytes) {
  std::int64_t length = static_cast<std::int64_t>(bytes.size());
  std::vector<std::int64_t> lengths(size_);
  all_gather(&length, lengths.data(), 1, DType::kInt64);
  std::int64_t longest = 0;
  for (auto l : lengths) longest = std::max(longest, l);
  std::string padded = bytes;
  padded.resize(static_cast<std::size_t>(longest));
  std::string all(static_cast<std::size_t>(longest) * size_, '\0');
  all_gather(padded.data(), all.data(), padded.size(), DType::kUInt8);
  std::vector<std::string> out(size_);
  for (int r = 0; r < size_; ++r)
    out[r] = all.substr(static_cast<std::size_t>(longest) * r, lengths[r]);
  return out;
}

std::shared_ptr<void> ProcessGroup::allocate(std::size_t bytes) {
  return backend_->allocate(bytes);
}

std::string ProcessGroup::algorithm_for(const std::string& collective, std::size_t bytes) const {
  return backend_ ? backend_->algorithm_for(collective, bytes) : "";
}

std::shared_ptr<void> ProcessGroup::allocate_node_shared(std::size_t bytes) {
  if (size_ == 1) return nullptr;
  std::int64_t offset = rank_ == 0 ? backend_->offer_node_shared(bytes) : -1;
  broadcast(&offset, 1, DType::kInt64, 0);  // in order with every other collective
  return offset < 0 ? nullptr : backend_->node_shared_at(offset, bytes);
}

}  // namespace ddp
