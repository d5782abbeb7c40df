// GradSync on a synthetic training step with real per-layer compute: run
// under ddprun, e.g. `ddprun --nproc_per_node=2 gradsync_bench`.
//
// The model is the reference trainer's MLP shape: `layers` square layers of
// `width` (default 4 x 888, 3.16M parameters, 12.6 MB of float32 gradients),
// ReLU between them, batch 64 per rank, least-squares loss. A step is forward,
// backward (each layer's gradients computed with OpenBLAS, one thread, and
// marked ready at once, so the bucket all-reduces overlap the rest of the
// backward pass on the group's own thread, or run inline between layers),
// finish(), and an SGD update.
//
// Rank 0 prints:
//   - the single-process step (rank 0 computing alone, the others idle),
//   - the compute-only step with every rank computing at once (no
//     communication: what sharing the machine costs by itself),
//   - the standalone all_reduce of all gradients (one blocking call),
//   - per bucket cap (1, 4, 25, 100 MiB) with the all-reduces overlapped on the
//     group's thread, and (4, 25 MiB) run inline on the compute thread
//     (GradSync's CommMode): the step with GradSync, its ratio to the
//     single-process step, and GradSync's own backward / communication /
//     overlap / exposed-communication figures,
// then whether the targets are met: step <= 1.04x single-process, exposed
// communication < 0.5x the standalone all-reduce. The configurations are
// measured in turn, several rounds (a shared machine drifts); times are
// medians, of the slowest rank.
//
// --device: the model and GradSync's buckets on the GPU, against the same step
// without gradient sync (gradsync_bench_device.h). --help lists the flags.

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ddp/bucket_layout.h"
#include "ddp/ddp.h"
#include "ddp/grad_sync.h"
#include "ddp/log.h"
#include "ddp/shared_grad_sum.h"
#include "gradsync_bench_device.h"
#include "gradsync_bench_options.h"

#ifdef DDP_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// CPU time (user + system, every thread) this process has used, in ms.
double cpu_ms() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto ms = [](const timeval& t) { return t.tv_sec * 1e3 + t.tv_usec / 1e3; };
  return ms(u.ru_utime) + ms(u.ru_stime);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// C = alpha * op(A) * op(B) + beta * C, row-major.
void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc) {
#ifdef DDP_HAVE_OPENBLAS
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, alpha, a, lda, b, ldb, beta, c, ldc);
#else
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      float s = 0;
      for (int p = 0; p < k; ++p)
        s += (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
      c[i * ldc + j] = alpha * s + (beta == 0 ? 0 : beta * c[i * ldc + j]);
    }
  }
#endif
}

using Config = bench::GradSyncBenchConfig;

// The MLP, its activations, and its gradients' home (GradSync views or plain buffers).
class Mlp {
 public:
  explicit Mlp(const Config& c) : c_(c) {
    std::mt19937 gen(42);
    std::normal_distribution<float> init(0.0f, 1.0f / std::sqrt(static_cast<float>(c.width)));
    const std::size_t ww = static_cast<std::size_t>(c.width) * c.width;
    for (int l = 0; l < c.layers; ++l) {
      w_.emplace_back(ww);
      b_.emplace_back(c.width, 0.0f);
      for (auto& v : w_.back()) v = init(gen);
      own_gw_.emplace_back(ww);
      own_gb_.emplace_back(c.width);
    }
    const std::size_t act = static_cast<std::size_t>(c.batch) * c.width;
    for (int l = 0; l <= c.layers; ++l) z_.emplace_back(act);
    dz_.resize(act);
    dh_.resize(act);
    target_.resize(act);
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto& v : z_[0]) v = u(gen);  // the input
    for (auto& v : target_) v = u(gen);
  }

  std::vector<ddp::GradParam> params() const {
    std::vector<ddp::GradParam> out;
    for (int l = 0; l < c_.layers; ++l) {
      out.push_back({"fc" + std::to_string(l + 1) + ".weight", {c_.width, c_.width}});
      out.push_back({"fc" + std::to_string(l + 1) + ".bias", {c_.width}});
    }
    return out;
  }
  std::size_t num_params() const {
    return static_cast<std::size_t>(c_.layers) *
           (static_cast<std::size_t>(c_.width) * c_.width + c_.width);
  }

  // One training step. With `sync`, gradients go to its views (scaled by
  // 1/world_size through the GEMM's alpha: prescaled_grads) and each layer is
  // marked ready as soon as it is computed.
  void step(ddp::GradAverager* sync) {
    const int B = c_.batch, W = c_.width, L = c_.layers;
    // Forward: z[l+1] = relu(z[l] W^T + b) (no relu on the last layer).
    for (int l = 0; l < L; ++l) {
      float* out = z_[l + 1].data();
      for (int i = 0; i < B; ++i)
        std::memcpy(out + static_cast<std::size_t>(i) * W, b_[l].data(), W * sizeof(float));
      gemm(false, true, B, W, W, 1.0f, z_[l].data(), W, w_[l].data(), W, 1.0f, out, W);
      if (l + 1 < L) {
        for (std::size_t k = 0; k < z_[l + 1].size(); ++k) out[k] = std::max(out[k], 0.0f);
      }
    }
    // Backward: dz = (y - t) / B.
    const float inv_b = 1.0f / static_cast<float>(B);
    for (std::size_t k = 0; k < dz_.size(); ++k) dz_[k] = (z_[L][k] - target_[k]) * inv_b;
    const float scale = sync ? sync->grad_scale() : 1.0f;
    if (sync) sync->begin_backward();
    auto* shared = dynamic_cast<ddp::SharedGradSum*>(sync);
    for (int l = L - 1; l >= 0; --l) {
      if (shared) {
        // The shared sum: each block of rows is set or added to by the GEMM
        // itself (beta 0 or 1), no pass of its own.
        shared->contribute(2 * l + 1, [&](const ddp::GradBlock& b) {
          float* gb = static_cast<float*>(b.data);
          if (!b.accumulate) std::fill(gb, gb + b.rows, 0.0f);
          for (int i = 0; i < B; ++i) {
            const float* row = dz_.data() + static_cast<std::size_t>(i) * W + b.row_begin;
            for (int j = 0; j < b.rows; ++j) gb[j] += row[j] * b.scale;
          }
        });
        shared->contribute(2 * l, [&](const ddp::GradBlock& b) {
          gemm(true, false, static_cast<int>(b.rows), W, B, b.scale, dz_.data() + b.row_begin, W,
               z_[l].data(), W, b.accumulate ? 1.0f : 0.0f, static_cast<float*>(b.data), W);
        });
      } else {
        write_layer_grads(dynamic_cast<ddp::GradSync*>(sync), l, scale);
      }
      if (l == 0) break;
      gemm(false, false, B, W, W, 1.0f, dz_.data(), W, w_[l].data(), W, 0.0f, dh_.data(),
           W);  // dx = dz W
      const float* z = z_[l].data();
      for (std::size_t k = 0; k < dz_.size(); ++k) dz_[k] = z[k] > 0 ? dh_[k] : 0.0f;
    }
    if (sync) sync->finish();
    // SGD.
    const float lr = 1e-3f;
    for (int l = 0; l < L; ++l) {
      const float* gw = sync ? sync->grad_view(2 * l) : own_gw_[l].data();
      const float* gb = sync ? sync->grad_view(2 * l + 1) : own_gb_[l].data();
      float* w = w_[l].data();
      for (std::size_t k = 0; k < w_[l].size(); ++k) w[k] -= lr * gw[k];
      for (int j = 0; j < W; ++j) b_[l][j] -= lr * gb[j];
    }
  }

 private:
  // Layer l's gradients into GradSync's views (or this process's own
  // buffers), each parameter marked ready as soon as it is written.
  void write_layer_grads(ddp::GradSync* sync, int l, float scale) {
    const int B = c_.batch, W = c_.width;
    float* gb = sync ? sync->grad_view(2 * l + 1) : own_gb_[l].data();
    float* gw = sync ? sync->grad_view(2 * l) : own_gw_[l].data();
    for (int j = 0; j < W; ++j) gb[j] = 0;
    for (int i = 0; i < B; ++i) {
      const float* row = dz_.data() + static_cast<std::size_t>(i) * W;
      for (int j = 0; j < W; ++j) gb[j] += row[j];
    }
    if (scale != 1.0f) {
      for (int j = 0; j < W; ++j) gb[j] *= scale;
    }
    if (sync) sync->mark_ready(2 * l + 1);
    gemm(true, false, W, W, B, scale, dz_.data(), W, z_[l].data(), W, 0.0f, gw,
         W);  // dW = dz^T x
    if (sync) sync->mark_ready(2 * l);
  }

  Config c_;
  std::vector<std::vector<float>> w_, b_, own_gw_, own_gb_, z_;
  std::vector<float> dz_, dh_, target_;
};

double max_over_ranks(ddp::ProcessGroup& pg, double v) {
  pg.all_reduce(&v, 1, ddp::DType::kFloat64, ddp::ReduceOp::kMax);
  return v;
}

struct Row {
  double cap_mib;
  ddp::CommMode mode;
  std::size_t buckets;
  double step, backward, comm, overlap, exposed;
};

}  // namespace

int run(const Config& c) {
#ifdef DDP_HAVE_OPENBLAS
  openblas_set_num_threads(1);
  const char* blas = "openblas, 1 thread";
#else
  const char* blas = "plain loops";
#endif
  auto pg = ddp::init();
  const int rank = pg->rank(), n = pg->size();
  // GradSync's own per-iteration log lines would interleave with the table.
  ddp::log::set_level(ddp::log::Level::kWarn);
  Mlp model(c);
  const std::size_t grad_bytes = model.num_params() * sizeof(float);
  if (rank == 0) {
    std::printf(
        "# gradsync_bench: %d layers of %dx%d + bias (%zu params, %.2f MB float32 gradients), "
        "batch %d per rank, %d rank(s), backend %s, %s, compression %s\n",
        c.layers, c.width, c.width, model.num_params(), grad_bytes / 1e6, c.batch, n,
        pg->backend_name().c_str(), blas, ddp::compression_name(c.compression));
    std::printf(
        "# medians of %d rounds x %d steps (configurations measured in turn each round, after %d "
        "warm-up steps); step = forward + backward + finish + SGD update; the slowest rank "
        "counts\n",
        c.rounds, c.steps, c.warmup);
    std::fflush(stdout);
  }

  // One GradSync per bucket cap (and the SharedGradSum); gradients written
  // through views with the GEMM's alpha carrying 1/world_size (prescaled_grads).
  std::vector<std::unique_ptr<ddp::GradAverager>> syncs;
  std::vector<std::pair<double, ddp::CommMode>> configs;
  for (double cap : c.caps_mib) configs.emplace_back(cap, ddp::CommMode::kOverlap);
  for (double cap : c.inline_caps_mib) configs.emplace_back(cap, ddp::CommMode::kInline);
  // The shared sum needs memory every rank maps: ranks of one node under shm.
  const bool shared_possible = n == 1 || pg->backend_name() == "shm";
  if (c.shared && shared_possible) configs.emplace_back(-1, ddp::CommMode::kShared);
  if (c.shared && !shared_possible && rank == 0) {
    std::printf(
        "# comm_mode shared skipped: backend %s (it needs the ranks of one node under shm)\n",
        pg->backend_name().c_str());
  }
  for (auto [cap, mode] : configs) {
    ddp::GradSyncOptions options;
    options.comm_mode = mode;
    options.bucket_cap_bytes = static_cast<std::size_t>(cap * (1 << 20));
    options.first_bucket_bytes = static_cast<std::size_t>(c.first_mib * (1 << 20));
    if (cap == 0) {  // the reference without overlap: one bucket, reduced when backward ends
      options.bucket_cap_bytes = options.first_bucket_bytes = std::size_t{1} << 40;
    }
    options.prescaled_grads = true;
    options.shared_block_bytes = static_cast<std::size_t>(c.shared_block_kib * 1024);
    options.compression = mode == ddp::CommMode::kShared ? ddp::Compression::kNone : c.compression;
    options.log_every = 0;
    syncs.push_back(ddp::make_grad_averager(*pg, model.params(), options));
  }
  for (int s = 0; s < c.warmup; ++s) model.step(nullptr);
  for (auto& sync : syncs) {
    for (int s = 0; s < c.warmup; ++s) model.step(sync.get());  // includes the layout rebuild
  }
  std::vector<float> buffer(model.num_params(), 1.0f);
  for (int s = 0; s < 3; ++s) pg->all_reduce(buffer.data(), buffer.size(), ddp::DType::kFloat32);

  struct Samples {
    std::vector<double> step, backward, comm, overlap, exposed;
  };
  std::vector<double> single, concurrent, allreduce, allreduce_cpu;
  std::vector<Samples> per_cap(syncs.size());
  for (int round = 0; round < c.rounds; ++round) {
    // 1. One process alone (rank 0; the others wait in a barrier).
    if (rank == 0) {
      for (int s = 0; s < c.steps; ++s) {
        auto start = Clock::now();
        model.step(nullptr);
        single.push_back(ms_since(start));
      }
    }
    pg->barrier();
    // 2. Every rank computing at once, without communication.
    for (int s = 0; s < c.steps; ++s) {
      auto start = Clock::now();
      model.step(nullptr);
      concurrent.push_back(ms_since(start));
    }
    // 3. The all-reduce of every gradient, alone.
    for (int s = 0; s < std::max(2, c.steps / 2); ++s) {
      pg->barrier();
      const double cpu_start = cpu_ms();
      auto start = Clock::now();
      pg->all_reduce(buffer.data(), buffer.size(), ddp::DType::kFloat32);
      allreduce.push_back(ms_since(start));
      allreduce_cpu.push_back(cpu_ms() - cpu_start);
    }
    // 4. GradSync, per bucket cap.
    for (std::size_t k = 0; k < syncs.size(); ++k) {
      pg->barrier();
      for (int s = 0; s < c.steps; ++s) {
        auto start = Clock::now();
        model.step(syncs[k].get());
        per_cap[k].step.push_back(ms_since(start));
        auto st = syncs[k]->stats().last;
        per_cap[k].backward.push_back(st.backward_compute_ms);
        per_cap[k].comm.push_back(st.comm_ms);
        per_cap[k].overlap.push_back(st.overlap_ms);
        per_cap[k].exposed.push_back(st.exposed_comm_ms);
      }
    }
  }

  double single_ms = median(single);
  pg->broadcast(&single_ms, 1, ddp::DType::kFloat64, 0);
  const double concurrent_ms = max_over_ranks(*pg, median(concurrent));
  const double allreduce_ms = max_over_ranks(*pg, median(allreduce));
  const double allreduce_cpu_ms = max_over_ranks(*pg, median(allreduce_cpu));
  std::vector<Row> rows;
  for (std::size_t k = 0; k < syncs.size(); ++k) {
    const auto* bucketed = dynamic_cast<const ddp::GradSync*>(syncs[k].get());
    rows.push_back({configs[k].first, configs[k].second,
                    bucketed ? bucketed->layout().buckets.size() : 0,
                    max_over_ranks(*pg, median(per_cap[k].step)),
                    max_over_ranks(*pg, median(per_cap[k].backward)),
                    max_over_ranks(*pg, median(per_cap[k].comm)),
                    max_over_ranks(*pg, median(per_cap[k].overlap)),
                    max_over_ranks(*pg, median(per_cap[k].exposed))});
  }
  syncs.clear();

  if (rank == 0) {
    std::printf("%-44s %8.2f ms\n", "single-process step (rank 0 alone)", single_ms);
    std::printf("%-44s %8.2f ms (%.3fx single)\n",
                ("compute-only step, " + std::to_string(n) + " rank(s) at once").c_str(),
                concurrent_ms, concurrent_ms / single_ms);
    std::printf("%-44s %8.2f ms (%.2f MB float32, one blocking call; %.2f ms of CPU per rank)\n",
                "all_reduce of all gradients alone", allreduce_ms, grad_bytes / 1e6,
                allreduce_cpu_ms);
    std::printf("%10s %8s %8s %9s %10s %13s %9s %12s %12s %18s\n", "cap(MiB)", "comm", "buckets",
                "step(ms)", "vs_single", "backward(ms)", "comm(ms)", "overlap(ms)", "exposed(ms)",
                "exposed/allreduce");
    for (const Row& row : rows) {
      char ratio[32] = "-";
      if (n > 1 && allreduce_ms > 0) {
        std::snprintf(ratio, sizeof ratio, "%.2f", row.exposed / allreduce_ms);
      }
      char cap[32];
      if (row.mode == ddp::CommMode::kShared) {
        std::snprintf(cap, sizeof cap, "-");
      } else if (row.cap_mib == 0) {
        std::snprintf(cap, sizeof cap, "no-overlap");
      } else {
        std::snprintf(cap, sizeof cap, "%g", row.cap_mib);
      }
      std::printf("%10s %8s %8zu %9.2f %9.3fx %13.2f %9.2f %12.2f %12.2f %18s\n", cap,
                  ddp::comm_mode_name(row.mode), row.buckets, row.step, row.step / single_ms,
                  row.backward, row.comm, row.overlap, row.exposed, ratio);
    }
    if (!rows.empty()) {
      // The targets concern overlapped configurations (not the no-overlap reference).
      const Row* best = nullptr;
      const Row* dflt = nullptr;
      const Row* least = nullptr;
      for (const auto& r : rows) {
        if (r.cap_mib == 0) continue;
        if (!best || r.step < best->step) best = &r;
        if (!least || r.exposed < least->exposed) least = &r;
        if (r.cap_mib == 25 && r.mode == ddp::CommMode::kOverlap) dflt = &r;
      }
      if (!best) best = least = &rows[0];
      auto name = [](const Row& r) {
        if (r.mode == ddp::CommMode::kShared) return std::string("shared sum");
        char text[64];
        std::snprintf(text, sizeof text, "cap %g MiB %s", r.cap_mib, ddp::comm_mode_name(r.mode));
        return std::string(text);
      };
      if (n == 1) {
        std::printf(
            "targets: n/a with one rank (no communication); GradSync step %.3fx single-process\n",
            best->step / single_ms);
      } else {
        const double ratio = best->step / single_ms;
        std::printf("target step <= 1.04x single-process: %s (best: %s, %.3fx",
                    ratio <= 1.04 ? "MET" : "NOT MET", name(*best).c_str(), ratio);
        if (dflt) std::printf("; 25 MiB overlapped: %.3fx", dflt->step / single_ms);
        std::printf(")\n");
        const double exposed_ratio = least->exposed / allreduce_ms;
        std::printf(
            "target exposed communication < 0.5x standalone all_reduce: %s (best: %s, "
            "%.2f ms of %.2f ms, %.2fx",
            exposed_ratio < 0.5 ? "MET" : "NOT MET", name(*least).c_str(), least->exposed,
            allreduce_ms, exposed_ratio);
        if (dflt) std::printf("; 25 MiB overlapped: %.2fx", dflt->exposed / allreduce_ms);
        std::printf(")\n");
      }
    }
    std::fflush(stdout);
  }
  ddp::shutdown();
  return 0;
}

int main(int argc, char** argv) {
  const auto args = bench::parse_gradsync_bench_args(argc, argv);
  if (args.help) {
    std::printf("%s", bench::gradsync_bench_usage().c_str());
    return 0;
  }
  if (!args.error.empty()) {
    std::fprintf(stderr, "gradsync_bench: %s\n%s", args.error.c_str(),
                 bench::gradsync_bench_usage().c_str());
    return 64;
  }
  try {
    return args.config.device ? bench::run_gradsync_device_bench(args.config) : run(args.config);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradsync_bench: error: %s\n", e.what());
    return 1;
  }
}
