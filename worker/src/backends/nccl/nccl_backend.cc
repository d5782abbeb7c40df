// The NCCL backend: GPU collectives on device buffers, on a stream of its own.
// Host buffers (the helpers' scalars and byte strings) are staged through
// device memory, so every ProcessGroup call works with either kind.
// Compiled whenever CUDA and NCCL are found (DDP_HAVE_NCCL). Every NCCL call
// is checked and reported with NCCL's error string; a collective that does not
// finish within the group's timeout, an asynchronous NCCL error, a peer on this
// machine whose process exited (NCCL between GPUs of one machine never notices
// one), or ProcessGroup::abort() aborts the communicator instead of hanging.

#include "backends/nccl/nccl_id.h"
#include "core/backend.h"
#include "core/peer_watch.h"
#include "ddp/common/error.h"
#include "device/device_memory.h"

#ifdef DDP_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>
#endif

namespace ddp {

#ifndef DDP_HAVE_NCCL

bool nccl_available() { return false; }

std::string exchange_nccl_unique_id(Store&, int, std::chrono::milliseconds) {
  throw Error(
      "this libddp was built without NCCL (CUDA Toolkit and NCCL were not found at build time)");
}

std::unique_ptr<Backend> make_nccl_backend(const BackendConfig&) {
  throw Error(
      "backend 'nccl': this libddp was built without NCCL (CUDA Toolkit and NCCL were not found "
      "at build time); use DDP_BACKEND=gloo");
}

#else

namespace {

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess && r != ncclInProgress) {
    throw Error(std::string("nccl: ") + what + ": " + ncclGetErrorString(r));
  }
}

using device::check_cuda;

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    case DType::kUInt8:
      return ncclUint8;
  }
  throw Error("nccl: unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kProduct:
      return ncclProd;
  }
  throw Error("nccl: unknown op");
}

// Aborting a communicator takes about half a second (NCCL stops its proxy
// thread and closes its connections). A failed one is aborted in the
// background, so that a rank rebuilding its group after a failure forms the
// next one meanwhile; the process waits for every abort before it exits.
class Reaper {
 public:
  static Reaper& get() {
    static Reaper reaper;
    return reaper;
  }
  void abort(ncclComm_t comm) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(aborts_, [](std::future<void>& f) {
      return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    });
    aborts_.push_back(std::async(std::launch::async, [comm] { ncclCommAbort(comm); }));
  }

 private:
  std::mutex mutex_;
  std::vector<std::future<void> > aborts_;  // each future's destructor waits for its abort
};

class NcclBackend final : public Backend {
 public:
  explicit NcclBackend(const BackendConfig& config)
      : rank_(config.rank),
        size_(config.size),
        timeout_(config.timeout),
        device_(config.device),
        peers_(config.store, config.rank, config.rank - config.local_rank, config.local_size,
               nullptr, config.lost_nodes) {
    int devices = 0;
    if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess) {
      (void)cudaGetLastError();
      throw Error("nccl: rank " + std::to_string(rank_) +
                  " finds no usable CUDA device (cudaGetDeviceCount: " + cudaGetErrorString(e) +
                  "): the nccl backend needs a GPU");
    }
    if (device_ < 0 || device_ >= devices) {
      throw Error("nccl: rank " + std::to_string(rank_) + " wants CUDA device " +
                  std::to_string(device_) + " (LOCAL_RANK) but only " + std::to_string(devices) +
                  " are visible (CUDA_VISIBLE_DEVICES)");
    }
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    // The creation's waits for peers: connect_timeout when set (a group
    // rebuilt over members that all arrived: one that dies meanwhile fails it soon).
    const std::chrono::milliseconds connect =
        config.connect_timeout.count() > 0 ? std::min(config.connect_timeout, timeout_) : timeout_;
    std::string id_bytes = exchange_nccl_unique_id(*config.store, rank_, connect);
    ncclUniqueId id;
    std::memcpy(&id, id_bytes.data(), sizeof(id));
    // Non-blocking init so a peer that never arrives cannot hang us past the timeout.
    ncclConfig_t nccl_config = NCCL_CONFIG_INITIALIZER;
    nccl_config.blocking = 0;
    check_nccl(ncclCommInitRankConfig(&comm_, size_, id, rank_, &nccl_config),
               "ncclCommInitRankConfig");
    wait_comm_ready("ncclCommInitRank", connect);
  }

  ~NcclBackend() override {
    if (abort_requested_) fail();
    if (comm_ != nullptr) {
      // A non-blocking communicator finalizes asynchronously, and NCCL
      // refuses to destroy one before that completes (leaving it alive, and
      // the next communicator of the process broken): wait, bounded.
      ncclResult_t state = ncclCommFinalize(comm_);
      const auto deadline = std::chrono::steady_clock::now() +
                            std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(30));
      while (state == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
      }
      if (state == ncclSuccess) {
        ncclCommDestroy(comm_);
      } else {
        Reaper::get().abort(comm_);
      }
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  void all_reduce(void* host_or_device, std::size_t count, DType dtype, ReduceOp op) override {
    use_device();
    if (count == 0) return;
    Staging io(*this, host_or_device, count * dtype_size(dtype), true);
    check_nccl(
        ncclAllReduce(io.get(), io.get(), count, nccl_type(dtype), nccl_op(op), comm_, stream_),
        "ncclAllReduce");
    synchronize("all_reduce");
    io.copy_back();
  }
  void broadcast(void* host_or_device, std::size_t count, DType dtype, int root) override {
    use_device();
    if (count == 0) return;
    Staging io(*this, host_or_device, count * dtype_size(dtype), rank_ == root);
    check_nccl(ncclBroadcast(io.get(), io.get(), count, nccl_type(dtype), root, comm_, stream_),
               "ncclBroadcast");
    synchronize("broadcast");
    io.copy_back();
  }
  void reduce(void* host_or_device, std::size_t count, DType dtype, ReduceOp op,
              int root) override {
    use_device();
    if (count == 0) return;
    const std::size_t bytes = count * dtype_size(dtype);
    Staging in(*this, host_or_device, bytes, true);
    // Non-root ranks' data must stay unchanged: only root receives.
    void* recv = in.get();
    std::shared_ptr<void> scratch;
    if (rank_ != root) {
      scratch = allocate(bytes);
      recv = scratch.get();
    }
    check_nccl(
        ncclReduce(in.get(), recv, count, nccl_type(dtype), nccl_op(op), root, comm_, stream_),
        "ncclReduce");
    synchronize("reduce");
    if (rank_ == root) in.copy_back();
  }
  void all_gather(const void* in, void* out, std::size_t count, DType dtype) override {
    use_device();
    if (count == 0) return;
    const std::size_t bytes = count * dtype_size(dtype);
    Staging src(*this, const_cast<void*>(in), bytes, true);
    Staging dst(*this, out, bytes * size_, false);
    check_nccl(ncclAllGather(src.get(), dst.get(), count, nccl_type(dtype), comm_, stream_),
               "ncclAllGather");
    synchronize("all_gather");
    dst.copy_back();
  }
  void gather(const void* host_in, void* host_out, std::size_t count, DType dtype,
              int root) override {
    use_device();
    if (count == 0) return;
    const std::size_t bytes = count * dtype_size(dtype);
    Staging src(*this, const_cast<void*>(host_in), bytes, true);
    Staging dst(*this, rank_ == root ? host_out : nullptr, bytes * size_, false);
    const void* in = src.get();
    void* out = dst.get();
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    if (rank_ == root) {
      for (int r = 0; r < size_; ++r) {
        check_nccl(ncclRecv(static_cast<char*>(out) + r * bytes, count, nccl_type(dtype), r, comm_,
                            stream_),
                   "ncclRecv");
      }
    }
    check_nccl(ncclSend(in, count, nccl_type(dtype), root, comm_, stream_), "ncclSend");
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    synchronize("gather");
    dst.copy_back();
  }
  void scatter(const void* host_in, void* host_out, std::size_t count, DType dtype,
               int root) override {
    use_device();
    if (count == 0) return;
    const std::size_t bytes = count * dtype_size(dtype);
    Staging src(*this, rank_ == root ? const_cast<void*>(host_in) : nullptr, bytes * size_, true);
    Staging dst(*this, host_out, bytes, false);
    const void* in = src.get();
    void* out = dst.get();
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    if (rank_ == root) {
      for (int r = 0; r < size_; ++r) {
        check_nccl(ncclSend(static_cast<const char*>(in) + r * bytes, count, nccl_type(dtype), r,
                            comm_, stream_),
                   "ncclSend");
      }
    }
    check_nccl(ncclRecv(out, count, nccl_type(dtype), root, comm_, stream_), "ncclRecv");
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    synchronize("scatter");
    dst.copy_back();
  }
  void all_to_all(const void* host_in, void* host_out, std::size_t count, DType dtype) override {
    use_device();
    if (count == 0) return;
    const std::size_t bytes = count * dtype_size(dtype);
    Staging src(*this, const_cast<void*>(host_in), bytes * size_, true);
    Staging dst(*this, host_out, bytes * size_, false);
    const void* in = src.get();
    void* out = dst.get();
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size_; ++r) {
      check_nccl(ncclSend(static_cast<const char*>(in) + r * bytes, count, nccl_type(dtype), r,
                          comm_, stream_),
                 "ncclSend");
      check_nccl(
          ncclRecv(static_cast<char*>(out) + r * bytes, count, nccl_type(dtype), r, comm_, stream_),
          "ncclRecv");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    synchronize("all_to_all");
    dst.copy_back();
  }
  void reduce_scatter(const void* host_in, void* host_out, std::size_t count, DType dtype,
                      ReduceOp op) override {
    use_device();
    if (count == 0) return;
    const std::size_t bytes = count * dtype_size(dtype);
    Staging src(*this, const_cast<void*>(host_in), bytes * size_, true);
    Staging dst(*this, host_out, bytes, false);
    check_nccl(ncclReduceScatter(src.get(), dst.get(), count, nccl_type(dtype), nccl_op(op), comm_,
                                 stream_),
               "ncclReduceScatter");
    synchronize("reduce_scatter");
    dst.copy_back();
  }
  void barrier() override {
    use_device();
    if (!barrier_word_) barrier_word_ = allocate(sizeof(int));
    check_nccl(ncclAllReduce(barrier_word_.get(), barrier_word_.get(), 1, ncclInt32, ncclSum, comm_,
                             stream_),
               "ncclAllReduce (barrier)");
    synchronize("barrier");
  }
  std::shared_ptr<void> allocate(std::size_t bytes) override {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    return device::allocate(bytes, device_);
  }
  // From any thread: the collective in flight (or the next) aborts the
  // communicator and fails; the destructor aborts it if none runs.
  void abort() override { abort_requested_ = true; }

 private:
  // Collectives run on the caller's thread or the group's, which start on
  // device 0: make this rank's device current first (staging memory and
  // stream work must land on it). A failed communicator takes no more calls.
  void use_device() {
    if (abort_requested_) fail();
    if (failed_) {
      throw PeerExitedError("nccl: this rank's communicator was aborted after a failure");
    }
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  }

  // A buffer as NCCL needs it: device memory as is; host memory copied into a
  // device buffer (when `copy_in`) and, after the collective, back (copy_back).
  class Staging {
   public:
    Staging(NcclBackend& backend, void* p, std::size_t bytes, bool copy_in) : p_(p), bytes_(bytes) {
      if (p == nullptr || !is_host(p)) return;
      device_ = backend.allocate(bytes);
      if (copy_in)
        check_cuda(cudaMemcpy(device_.get(), p, bytes, cudaMemcpyHostToDevice),
                   "cudaMemcpy to device");
    }
    void* get() const { return device_ ? device_.get() : p_; }
    void copy_back() {
      if (device_)
        check_cuda(cudaMemcpy(p_, device_.get(), bytes_, cudaMemcpyDeviceToHost),
                   "cudaMemcpy to host");
    }

   private:
    static bool is_host(const void* p) {
      cudaPointerAttributes attributes{};
      if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky error of an unknown pointer: it is host memory
        return true;
      }
      return attributes.type == cudaMemoryTypeUnregistered || attributes.type == cudaMemoryTypeHost;
    }
    void* p_;
    std::size_t bytes_;
    std::shared_ptr<void> device_;
  };

  // Polls the stream and NCCL's async error until done; aborts on error,
  // timeout, abort(), a peer on this machine that exited (asked every 10 ms)
  // or a peer that left the group (asked every 200 ms after the first 200).
  void synchronize(const char* what) {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + timeout_;
    auto next_look = start + std::chrono::milliseconds(10);
    auto next_ask = start + std::chrono::milliseconds(200);
    for (;;) {
      // A non-blocking communicator may still be enqueueing the call
      // (ncclInProgress) while the stream looks idle: done needs both.
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess && async == ncclSuccess) return;
      if (e != cudaSuccess && e != cudaErrorNotReady) check_cuda(e, what);
      if (async != ncclSuccess && async != ncclInProgress) {
        fail();
        throw Error(std::string("nccl: ") + what +
                    ": asynchronous error: " + ncclGetErrorString(async));
      }
      if (abort_requested_) {
        fail();
        throw PeerExitedError(std::string("nccl: ") + what +
                              ": this rank left the group (aborted); the communicator was aborted");
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= next_look) {
        next_look = now + std::chrono::milliseconds(10);
        // A peer that left (aborted) may be alive: the store says so, asked
        // every 200 ms once a wait is that long (collectives seldom are).
        std::optional<std::string> gone = peers_.first_exited();
        if (!gone && now >= next_ask) {
          next_ask = now + std::chrono::milliseconds(200);
          gone = peers_.first_left();
        }
        if (gone) {
          fail();
          throw PeerExitedError(std::string("nccl: ") + what + ": " + *gone +
                                "; the communicator was aborted");
        }
      }
      if (now >= deadline) {
        fail();
        throw Error(std::string("nccl: ") + what + " timed out after " +
                    std::to_string(timeout_.count()) + " ms; the communicator was aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  void wait_comm_ready(const char* what, std::chrono::milliseconds limit) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        fail();
        throw Error(std::string("nccl: ") + what + ": " + ncclGetErrorString(state));
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        fail();
        throw Error(std::string("nccl: ") + what + " did not complete within " +
                    std::to_string(limit.count()) + " ms (a rank never joined?); aborted");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  // On the thread that owns the communicator: aborted in the background.
  void fail() {
    if (comm_ != nullptr) Reaper::get().abort(comm_);
    comm_ = nullptr;
    failed_ = true;
  }

  int rank_, size_;
  std::chrono::milliseconds timeout_;
  int device_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  bool failed_ = false;                       // comm_ is gone: aborted after a failure
  std::atomic<bool> abort_requested_{false};  // abort(), from any thread
  detail::PeerWatch peers_;
  std::shared_ptr<void> barrier_word_;
};

}  // namespace

bool nccl_available() { return true; }

std::string exchange_nccl_unique_id(Store& store, int rank, std::chrono::milliseconds timeout) {
  static const char kKey[] = "nccl_unique_id";
  if (rank == 0) {
    ncclUniqueId id;
    check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    std::string bytes(reinterpret_cast<const char*>(&id), sizeof(id));
    store.set(kKey, bytes);
    return bytes;
  }
  std::string bytes = store.get(kKey, timeout);
  if (bytes.size() != sizeof(ncclUniqueId)) {
    throw Error("nccl: key '" + std::string(kKey) + "' holds " + std::to_string(bytes.size()) +
                " bytes, expected " + std::to_string(sizeof(ncclUniqueId)));
  }
  return bytes;
}

std::unique_ptr<Backend> make_nccl_backend(const BackendConfig& config) {
  return std::make_unique<NcclBackend>(config);
}

#endif

}  // namespace ddp
