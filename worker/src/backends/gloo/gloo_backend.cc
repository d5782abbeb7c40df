// The Gloo backend: CPU collectives over TCP, rendezvous through our Store
// (adapted to gloo::rendezvous::Store). Elements travel as opaque words of the
// dtype's size; reductions use our typed kernels, so every dtype and op works.

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "backends/gloo/watched_context.h"
#include "core/backend.h"
#include "core/peer_watch.h"
#include "ddp/common/error.h"
#include "kernels/reduce_kernels.h"

namespace ddp {
namespace {

// Gloo's store interface over ours (Gloo's keys may contain '/').
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<ddp::Store> store, std::chrono::milliseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    std::string v = store_->get(key, timeout_);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<ddp::Store> store_;
  std::chrono::milliseconds timeout_;
};

// This process's TCP sockets: descriptor and inode. The inode tells a new
// socket from an old one whose descriptor number was closed and reused
// meanwhile (another thread's connection), which the number alone would miss.
std::set<std::pair<int, ino_t>> tcp_sockets() {
  std::set<std::pair<int, ino_t>> fds;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    char* end = nullptr;
    const std::string name = entry.path().filename().string();
    const long fd = std::strtol(name.c_str(), &end, 10);
    struct stat st {};
    int protocol = 0;
    socklen_t len = sizeof(protocol);
    if (*end == '\0' && ::fstat(static_cast<int>(fd), &st) == 0 && S_ISSOCK(st.st_mode) &&
        ::getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_PROTOCOL, &protocol, &len) == 0 &&
        protocol == IPPROTO_TCP) {
      fds.emplace(static_cast<int>(fd), st.st_ino);
    }
  }
  return fds;
}

// Calls `f` with a null pointer of the unsigned word type of the dtype's size.
template <class F>
void with_word(DType dtype, F&& f) {
  switch (dtype_size(dtype)) {
    case 1:
      return f(static_cast<std::uint8_t*>(nullptr));
    case 2:
      return f(static_cast<std::uint16_t*>(nullptr));
    case 4:
      return f(static_cast<std::uint32_t*>(nullptr));
    case 8:
      return f(static_cast<std::uint64_t*>(nullptr));
  }
  throw Error("unsupported element size");
}

class GlooBackend final : public Backend {
 public:
  explicit GlooBackend(const BackendConfig& config)
      : rank_(config.rank), size_(config.size), timeout_(config.timeout) {
    const std::chrono::milliseconds connect =
        config.connect_timeout.count() > 0 ? std::min(config.connect_timeout, timeout_) : timeout_;
    gloo::transport::tcp::attr attr;
    // Peers learn this address through the store. DDP_GLOO_IFACE picks an interface instead.
    const char* iface = std::getenv("DDP_GLOO_IFACE");
    if (iface != nullptr && *iface != '\0') {
      attr.iface = iface;
    } else {
      attr.hostname = config.host;
    }
    // The store's own connection must exist before the snapshot: one that
    // came up while the group connected would pass for the group's, and
    // abort() would cut this rank off its store.
    if (config.store) config.store->remove("gloo/connected");
    const auto before = tcp_sockets();
    try {
      auto device = gloo::transport::tcp::CreateDevice(attr);
      // A wait Gloo would leave to the timeout ends once its peers are gone:
      // processes exited (their keys are in this group's store), or a rank
      // left the enclosing ProcessGroup (an inner group of the shm backend
      // has a store of its own), or the rendezvous left one of its nodes out.
      auto peers = std::make_shared<detail::PeerWatch>(config.store, rank_,
                                                       rank_ - config.local_rank, config.local_size,
                                                       config.group_store, config.lost_nodes);
      // Asked only of waits already long: a departure (a survivor on another
      // node aborting) is then seen within 20 ms, not 200.
      peers->set_departure_spacing(std::chrono::milliseconds(20));
      auto context = std::make_shared<gloo_watch::WatchedContext>(
          rank_, size_, [peers](int r) { return peers->gone(r); });
      context->setTimeout(connect);
      GlooStoreAdapter store(config.store, connect);
      context->connectFullMesh(store, device);
      context->setTimeout(timeout_);
      context->watch();
      context_ = context;
      for (const auto& socket : tcp_sockets()) {
        if (!before.count(socket)) sockets_.push_back(socket.first);
      }
      // connectFullMesh can return on one rank while a peer is still finishing
      // its handshakes; the group exists once every rank is through, so a rank
      // that leaves right after creation cannot break a peer's creation.
      barrier(connect);
    } catch (const std::exception& e) {
      // Peers publish their addresses under their rank: a missing key names a missing rank.
      throw Error("gloo: creating the process group of " + std::to_string(size_) + " ranks: rank " +
                  std::to_string(rank_) + " could not connect to its peers: " + e.what());
    }
  }

  void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) override {
    if (count == 0) return;
    with_word(dtype, [&](auto* word) {
      using W = std::remove_pointer_t<decltype(word)>;
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(static_cast<W*>(data), count);
      opts.setReduceFunction(reduce_function(dtype, op));
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
    if (op == ReduceOp::kAvg) divide_in_place(data, count, dtype, size_);
  }

  void broadcast(void* data, std::size_t count, DType dtype, int root) override {
    if (count == 0) return;
    with_word(dtype, [&](auto* word) {
      using W = std::remove_pointer_t<decltype(word)>;
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<W*>(data), count);
      opts.setRoot(root);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) override {
    if (count == 0) return;
    // Gloo's reduce writes its scratch into non-root outputs: keep theirs intact.
    std::vector<char> scratch;
    void* out = data;
    if (rank_ != root) {
      scratch.resize(count * dtype_size(dtype));
      out = scratch.data();
    }
    with_word(dtype, [&](auto* word) {
      using W = std::remove_pointer_t<decltype(word)>;
      gloo::ReduceOptions opts(context_);
      opts.setInput(static_cast<W*>(data), count);
      opts.setOutput(static_cast<W*>(out), count);
      opts.setRoot(root);
      opts.setReduceFunction(reduce_function(dtype, op));
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::reduce(opts);
    });
    if (op == ReduceOp::kAvg && rank_ == root) divide_in_place(data, count, dtype, size_);
  }

  void all_gather(const void* in, void* out, std::size_t count, DType dtype) override {
    if (count == 0) return;
    with_word(dtype, [&](auto* word) {
      using W = std::remove_pointer_t<decltype(word)>;
      gloo::AllgatherOptions opts(context_);
      opts.setInput(const_cast<W*>(static_cast<const W*>(in)), count);
      opts.setOutput(static_cast<W*>(out), count * size_);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  void gather(const void* in, void* out, std::size_t count, DType dtype, int root) override {
    if (count == 0) return;
    with_word(dtype, [&](auto* word) {
      using W = std::remove_pointer_t<decltype(word)>;
      gloo::GatherOptions opts(context_);
      opts.setInput(const_cast<W*>(static_cast<const W*>(in)), count);
      if (rank_ == root) opts.setOutput(static_cast<W*>(out), count * size_);
      opts.setRoot(root);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::gather(opts);
    });
  }

  void scatter(const void* in, void* out, std::size_t count, DType dtype, int root) override {
    if (count == 0) return;
    with_word(dtype, [&](auto* word) {
      using W = std::remove_pointer_t<decltype(word)>;
      gloo::ScatterOptions opts(context_);
      std::vector<W*> slices;
      if (rank_ == root) {
        for (int r = 0; r < size_; ++r)
          slices.push_back(const_cast<W*>(static_cast<const W*>(in)) + r * count);
        opts.setInputs(slices, count);
      }
      opts.setOutput(static_cast<W*>(out), count);
      opts.setRoot(root);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::scatter(opts);
    });
  }

  void all_to_all(const void* in, void* out, std::size_t count, DType dtype) override {
    if (count == 0) return;
    with_word(dtype, [&](auto* word) {
      using W = std::remove_pointer_t<decltype(word)>;
      gloo::AlltoallOptions opts(context_);
      opts.setInput(const_cast<W*>(static_cast<const W*>(in)), count * size_);
      opts.setOutput(static_cast<W*>(out), count * size_);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::alltoall(opts);
    });
  }

  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype,
                      ReduceOp op) override {
    if (count == 0) return;
    // Gloo 0.5 has no typed reduce-scatter with custom reductions: all-reduce a
    // copy and keep this rank's slice (twice the optimal traffic).
    const std::size_t bytes = count * dtype_size(dtype);
    std::vector<char> all(static_cast<const char*>(in),
                          static_cast<const char*>(in) + bytes * size_);
    all_reduce(all.data(), count * size_, dtype, op);
    std::memcpy(out, all.data() + bytes * rank_, bytes);
  }

  // Gloo's close() leaves its sockets open (a peer waiting on this rank
  // would wait out the timeout), so abort shuts down the TCP sockets that
  // appeared while the group connected: peers' pending receives fail at
  // once, as when this process dies. shutdown() keeps the descriptors
  // (Gloo closes them), so none is reused under it. This rank's own waits
  // end too (Gloo would leave a send already under way waiting).
  void abort() override {
    context_->abandon_all("gloo: this rank left the group (it aborted it)");
    for (int fd : sockets_) ::shutdown(fd, SHUT_RDWR);
  }

  void barrier() override { barrier(timeout_); }

 private:
  void barrier(std::chrono::milliseconds timeout) {
    gloo::BarrierOptions opts(context_);
    opts.setTag(next_tag());
    opts.setTimeout(timeout);
    gloo::barrier(opts);
  }

  uint32_t next_tag() { return tag_++; }

  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo_watch::WatchedContext> context_;
  std::vector<int> sockets_;  // the group's connections (abort)
  uint32_t tag_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_gloo_backend(const BackendConfig& config) {
  return std::make_unique<GlooBackend>(config);
}

}  // namespace ddp
