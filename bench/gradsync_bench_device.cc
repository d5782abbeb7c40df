// gradsync_bench --device. The model is gradsync_bench's MLP shape without
// the ReLUs (linear layers: every operation is then a cuBLAS call, so the
// benchmark needs no kernels of its own), on one stream: forward, the loss
// gradient, then per layer (last first) the bias and weight gradients, the
// input gradient, and mark_ready() once the gradients' kernels have run (as
// GradSync requires for device memory), finish(), and an SGD update. The
// reference is the same step writing its gradients to buffers of its own
// with no GradSync at all. Every step ends with the stream synchronized, so
// wall-clock times include the GPU's work.
//
// cuBLAS is column-major; a row-major product C = op(A) op(B) is computed as
// the column-major C^T = op(B)^T op(A)^T with the same pointers.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ddp/bucket_layout.h"
#include "ddp/common/error.h"
#include "ddp/ddp.h"
#include "ddp/grad_sync.h"
#include "ddp/log.h"
#include "gradsync_bench_device.h"

namespace bench {
namespace {

using Clock = std::chrono::steady_clock;

void check_cuda(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return;
  int device = -1;
  (void)cudaGetDevice(&device);
  throw ddp::Error("cuda:" + std::to_string(device) + ": " + call + ": " + cudaGetErrorName(e) +
                   " (" + cudaGetErrorString(e) + ")");
}

void check_cublas(cublasStatus_t s, const char* call) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw ddp::Error(std::string("cuBLAS ") + call + ": " + cublasGetStatusName(s) + " (" +
                   cublasGetStatusString(s) + ")");
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// `n` floats of device memory, owned.
class DeviceFloats {
 public:
  explicit DeviceFloats(std::size_t n = 0) : n_(n) {
    if (n == 0) return;
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, n * sizeof(float)), "cudaMalloc");
    p_.reset(static_cast<float*>(p));
    check_cuda(cudaMemset(p, 0, n * sizeof(float)), "cudaMemset");
  }
  float* get() const { return p_.get(); }
  std::size_t size() const { return n_; }
  void upload(const std::vector<float>& host) {
    check_cuda(cudaMemcpy(p_.get(), host.data(), n_ * sizeof(float), cudaMemcpyHostToDevice),
               "cudaMemcpy (host to device)");
  }

 private:
  struct Free {
    void operator()(float* p) const { (void)cudaFree(p); }
  };
  std::unique_ptr<float, Free> p_;
  std::size_t n_ = 0;
};

// The stream every kernel of this rank runs on (a blocking one, ordered with
// the legacy default stream GradSync's own memsets use) and cuBLAS bound to it.
class Gpu {
 public:
  explicit Gpu(int device) {
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    check_cuda(cudaStreamCreate(&stream_), "cudaStreamCreate");
    check_cuda(cudaEventCreateWithFlags(&grads_done_, cudaEventDisableTiming), "cudaEventCreate");
    check_cublas(cublasCreate(&blas_), "cublasCreate");
    check_cublas(cublasSetStream(blas_, stream_), "cublasSetStream");
  }
  ~Gpu() {
    (void)cudaStreamSynchronize(stream_);
    (void)cublasDestroy(blas_);
    (void)cudaEventDestroy(grads_done_);
    (void)cudaStreamDestroy(stream_);
  }
  Gpu(const Gpu&) = delete;
  Gpu& operator=(const Gpu&) = delete;

  // Row-major C[m x n] = alpha op(A) op(B) + beta C.
  void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) {
    check_cublas(cublasSgemm(blas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                             n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc),
                 "sgemm");
  }
  // c = alpha a + beta b, elementwise over n floats.
  void axpby(std::size_t n, float alpha, const float* a, float beta, const float* b, float* c) {
    check_cublas(
        cublasSgeam(blas_, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), 1, &alpha, a,
                    static_cast<int>(n), &beta, b, static_cast<int>(n), c, static_cast<int>(n)),
        "sgeam");
  }
  // Waits until everything enqueued so far has run, while later work may be enqueued.
  void mark() { check_cuda(cudaEventRecord(grads_done_, stream_), "cudaEventRecord"); }
  void wait_mark() { check_cuda(cudaEventSynchronize(grads_done_), "cudaEventSynchronize"); }
  void sync() { check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t grads_done_ = nullptr;
  cublasHandle_t blas_ = nullptr;
};

class DeviceMlp {
 public:
  DeviceMlp(Gpu& gpu, const GradSyncBenchConfig& c, int device) : gpu_(gpu), c_(c) {
    std::mt19937 gen(42);
    std::normal_distribution<float> init(0.0f, 1.0f / std::sqrt(static_cast<float>(c.width)));
    std::uniform_real_distribution<float> u(-1, 1);
    const std::size_t ww = static_cast<std::size_t>(c.width) * c.width;
    const std::size_t act = static_cast<std::size_t>(c.batch) * c.width;
    std::vector<float> host(ww);
    for (int l = 0; l < c.layers; ++l) {
      for (auto& v : host) v = init(gen);
      w_.emplace_back(ww);
      w_.back().upload(host);
      b_.emplace_back(c.width);
      own_gw_.emplace_back(ww);
      own_gb_.emplace_back(c.width);
    }
    for (int l = 0; l <= c.layers; ++l) z_.emplace_back(act);
    host.assign(act, 0.0f);
    for (auto& v : host) v = u(gen);
    z_[0].upload(host);  // the input
    for (auto& v : host) v = u(gen);
    target_ = DeviceFloats(act);
    target_.upload(host);
    dz_ = DeviceFloats(act);
    dh_ = DeviceFloats(act);
    ones_ = DeviceFloats(c.batch);
    ones_.upload(std::vector<float>(c.batch, 1.0f));
    for (int l = 0; l < c.layers; ++l) {
      params_.push_back({"fc" + std::to_string(l + 1) + ".weight", {c.width, c.width}});
      params_.push_back({"fc" + std::to_string(l + 1) + ".bias", {c.width}});
    }
    for (auto& p : params_) p.device = device;
  }

  const std::vector<ddp::GradParam>& params() const { return params_; }
  std::size_t num_params() const {
    return static_cast<std::size_t>(c_.layers) *
           (static_cast<std::size_t>(c_.width) * c_.width + c_.width);
  }

  // One step; with `sync` the gradients go to its device views (scaled by
  // 1/world through the GEMMs' alpha: prescaled_grads).
  void step(ddp::GradSync* sync) {
    const int B = c_.batch, W = c_.width, L = c_.layers;
    for (int l = 0; l < L; ++l) {  // z[l+1] = ones b^T + z[l] W^T
      gpu_.gemm(false, false, B, W, 1, 1.0f, ones_.get(), 1, b_[l].get(), W, 0.0f, z_[l + 1].get(),
                W);
      gpu_.gemm(false, true, B, W, W, 1.0f, z_[l].get(), W, w_[l].get(), W, 1.0f, z_[l + 1].get(),
                W);
    }
    const float inv_b = 1.0f / static_cast<float>(B);
    gpu_.axpby(dz_.size(), inv_b, z_[L].get(), -inv_b, target_.get(), dz_.get());
    const float scale = sync ? sync->grad_scale() : 1.0f;
    if (sync) sync->begin_backward();
    float* dz = dz_.get();
    float* dh = dh_.get();
    for (int l = L - 1; l >= 0; --l) {
      float* gb = sync ? sync->grad_view(2 * l + 1) : own_gb_[l].get();
      float* gw = sync ? sync->grad_view(2 * l) : own_gw_[l].get();
      gpu_.gemm(false, false, 1, W, B, scale, ones_.get(), B, dz, W, 0.0f, gb, W);
      gpu_.gemm(true, false, W, W, B, scale, dz, W, z_[l].get(), W, 0.0f, gw, W);
      if (sync) gpu_.mark();
      if (l > 0) {  // dx = dz W, enqueued before waiting so the GPU stays busy
        gpu_.gemm(false, false, B, W, W, 1.0f, dz, W, w_[l].get(), W, 0.0f, dh, W);
        std::swap(dz, dh);
      }
      if (sync) {
        gpu_.wait_mark();
        sync->mark_ready(2 * l + 1);
        sync->mark_ready(2 * l);
      }
    }
    if (sync) sync->finish();
    const float lr = 1e-4f;
    for (int l = 0; l < L; ++l) {
      const float* gw = sync ? sync->grad_view(2 * l) : own_gw_[l].get();
      const float* gb = sync ? sync->grad_view(2 * l + 1) : own_gb_[l].get();
      gpu_.axpby(w_[l].size(), 1.0f, w_[l].get(), -lr, gw, w_[l].get());
      gpu_.axpby(b_[l].size(), 1.0f, b_[l].get(), -lr, gb, b_[l].get());
    }
    gpu_.sync();
  }

 private:
  Gpu& gpu_;
  GradSyncBenchConfig c_;
  std::vector<ddp::GradParam> params_;
  std::vector<DeviceFloats> w_, b_, own_gw_, own_gb_, z_;
  DeviceFloats dz_, dh_, target_, ones_;
};

int local_rank() {
  const char* text = std::getenv("LOCAL_RANK");
  if (!text || !*text) return 0;
  int v = -1;
  const char* end = text + std::char_traits<char>::length(text);
  auto [p, ec] = std::from_chars(text, end, v);
  if (ec != std::errc() || p != end || v < 0) {
    throw ddp::Error(std::string("LOCAL_RANK '") + text + "' is not a local rank");
  }
  return v;
}

struct Row {
  double cap_mib;
  ddp::CommMode mode;
  std::size_t buckets;
  std::vector<double> step, comm, exposed;
};

double max_over_ranks(ddp::ProcessGroup& pg, double v) {
  pg.all_reduce(&v, 1, ddp::DType::kFloat64, ddp::ReduceOp::kMax);
  return v;
}

}  // namespace

int run_gradsync_device_bench(const GradSyncBenchConfig& c) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    throw ddp::Error(std::string("--device: no CUDA device here (cudaGetDeviceCount: ") +
                     (e == cudaSuccess ? "0 devices" : cudaGetErrorString(e)) + ")");
  }
  const int device = local_rank();
  if (device >= devices) {
    throw ddp::Error("--device: LOCAL_RANK " + std::to_string(device) + " but " +
                     std::to_string(devices) + " CUDA device(s) are visible");
  }
  auto pg = ddp::init();
  if (pg->backend_name() != "nccl") {
    throw ddp::Error("--device needs the nccl backend (DDP_BACKEND=nccl); this run's is " +
                     pg->backend_name());
  }
  ddp::log::set_level(ddp::log::Level::kWarn);
  const int rank = pg->rank(), n = pg->size();
  Gpu gpu(device);
  DeviceMlp model(gpu, c, device);
  const std::size_t grad_bytes = model.num_params() * sizeof(float);
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  if (rank == 0) {
    std::printf(
        "# gradsync_bench --device: %d linear layers of %dx%d + bias (%zu params, %.2f MB "
        "float32 gradients), batch %d per rank, %d rank(s), backend %s, %s, cuBLAS sgemm\n",
        c.layers, c.width, c.width, model.num_params(), grad_bytes / 1e6, c.batch, n,
        pg->backend_name().c_str(), prop.name);
    std::printf(
        "# medians of %d rounds x %d steps (in turn each round, after %d warm-up steps); step = "
        "forward + backward + finish + SGD, stream synchronized; the slowest rank counts\n",
        c.rounds, c.steps, c.warmup);
    std::fflush(stdout);
  }
  std::vector<Row> rows;
  std::vector<std::unique_ptr<ddp::GradSync>> syncs;
  auto add = [&](double cap, ddp::CommMode mode) {
    ddp::GradSyncOptions options;
    options.comm_mode = mode;
    options.bucket_cap_bytes = static_cast<std::size_t>(cap * (1 << 20));
    options.first_bucket_bytes = static_cast<std::size_t>(c.first_mib * (1 << 20));
    if (cap == 0) options.bucket_cap_bytes = options.first_bucket_bytes = std::size_t{1} << 40;
    options.prescaled_grads = true;
    options.log_every = 0;
    syncs.push_back(std::make_unique<ddp::GradSync>(*pg, model.params(), options));
    rows.push_back({cap, mode, 0, {}, {}, {}});
  };
  for (double cap : c.caps_mib) add(cap, ddp::CommMode::kOverlap);
  for (double cap : c.inline_caps_mib) add(cap, ddp::CommMode::kInline);
  for (int s = 0; s < c.warmup; ++s) model.step(nullptr);
  for (auto& sync : syncs) {
    for (int s = 0; s < c.warmup; ++s) model.step(sync.get());  // includes the layout rebuild
  }
  auto all = pg->allocate(grad_bytes);
  std::vector<double> plain, allreduce;
  for (int round = 0; round < c.rounds; ++round) {
    pg->barrier();
    for (int s = 0; s < c.steps; ++s) {
      auto start = Clock::now();
      model.step(nullptr);
      plain.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    }
    for (int s = 0; s < std::max(2, c.steps / 2); ++s) {
      pg->barrier();
      auto start = Clock::now();
      pg->all_reduce(all.get(), model.num_params(), ddp::DType::kFloat32);
      allreduce.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    }
    for (std::size_t k = 0; k < syncs.size(); ++k) {
      pg->barrier();
      for (int s = 0; s < c.steps; ++s) {
        auto start = Clock::now();
        model.step(syncs[k].get());
        rows[k].step.push_back(
            std::chrono::duration<double, std::milli>(Clock::now() - start).count());
        const auto st = syncs[k]->stats().last;
        rows[k].comm.push_back(st.comm_ms);
        rows[k].exposed.push_back(st.exposed_comm_ms);
      }
      rows[k].buckets = syncs[k]->layout().buckets.size();
    }
  }
  const double plain_ms = max_over_ranks(*pg, median(plain));
  const double allreduce_ms = max_over_ranks(*pg, median(allreduce));
  std::vector<double> step_ms, comm_ms, exposed_ms;
  for (auto& row : rows) {
    step_ms.push_back(max_over_ranks(*pg, median(row.step)));
    comm_ms.push_back(max_over_ranks(*pg, median(row.comm)));
    exposed_ms.push_back(max_over_ranks(*pg, median(row.exposed)));
  }
  syncs.clear();
  if (rank == 0) {
    std::printf("%-44s %8.2f ms\n", "step without gradient sync", plain_ms);
    std::printf("%-44s %8.2f ms (%.2f MB float32, device buffer, one blocking call)\n",
                "all_reduce of all gradients alone", allreduce_ms, grad_bytes / 1e6);
    std::printf("%10s %8s %8s %9s %12s %9s %12s\n", "cap(MiB)", "comm", "buckets", "step(ms)",
                "vs_no_sync", "comm(ms)", "exposed(ms)");
    for (std::size_t k = 0; k < rows.size(); ++k) {
      char cap[32];
      if (rows[k].cap_mib == 0) {
        std::snprintf(cap, sizeof cap, "no-overlap");
      } else {
        std::snprintf(cap, sizeof cap, "%g", rows[k].cap_mib);
      }
      std::printf("%10s %8s %8zu %9.2f %11.3fx %9.2f %12.2f\n", cap,
                  ddp::comm_mode_name(rows[k].mode), rows[k].buckets, step_ms[k],
                  step_ms[k] / plain_ms, comm_ms[k], exposed_ms[k]);
    }
    std::fflush(stdout);
  }
  ddp::shutdown();
  return 0;
}

}  // namespace bench
