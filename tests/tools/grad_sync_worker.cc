// A worker for GradSync's integration tests, run under ddprun (or alone, as a
// world of one). Modes (see usage()):
//   equiv   every rank computes the gradients of an MLP on its shard of a
//           batch; GradSync's averages must equal the whole batch's gradient
//           (computed here in double). Prints "GRADSYNC OK rank=R world=N".
//   capi    the same kind of check through the C API (ddp_c.h), with
//           accumulation; prints "GRADSYNC CAPI OK rank=R".
//   unused  rank 1 never marks 'fc2.bias': every rank prints
//           "EXPECTED ERROR rank=R: <error>" and exits 0.
// A failed check prints "GRADSYNC FAILED rank=R: <what>" on stderr, exit 1.

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/ddp.h"
#include "ddp/ddp_c.h"
#include "ddp/grad_sync.h"
#include "reference_mlp.h"

namespace {

int usage() {
  std::fprintf(stderr, "usage: grad_sync_worker equiv|capi|unused\n");
  return 64;
}

struct CheckFailed {
  std::string what;
};
[[noreturn]] void fail(const std::string& what) { throw CheckFailed{what}; }

// The reference MLP of the unit tests (tests/support/reference_mlp.h), smaller.
const std::vector<int> kSizes = {6, 10, 9, 4};
const int kLayers = 3;

using ddp::testing::make_batch;
using ddp::testing::make_mlp;
using ddp::testing::Mlp;
using ddp::testing::mlp_grads;

std::vector<ddp::GradParam> params() { return ddp::testing::mlp_params(make_mlp(kSizes, 0)); }

void expect_close(const float* got, const std::vector<double>& want, const std::string& what) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    // float32 rounding of each rank's gradient and of the mean (see the unit tests).
    if (std::abs(got[i] - want[i]) > 1e-6 + 1e-5 * std::abs(want[i])) {
      fail(what + "[" + std::to_string(i) + "] is " + std::to_string(got[i]) + ", expected " +
           std::to_string(want[i]));
    }
  }
}

void run_equiv(ddp::ProcessGroup& pg) {
  const int world = pg.size(), batch = 12 * world;
  const Mlp model = make_mlp(kSizes, 3);
  // Every rank but 0 starts from different weights: prepare() must fix that.
  Mlp mine = model;
  if (pg.rank() != 0) {
    for (auto& w : mine.w) {
      for (auto& v : w) v += pg.rank();
    }
  }
  ddp::GradSyncOptions options;
  options.bucket_cap_bytes = 200;  // smaller than fc2.weight (360 B)
  options.first_bucket_bytes = 64;
  options.log_every = 0;
  ddp::GradSync sync(pg, params(), options);
  std::vector<std::vector<float>> values;
  for (int l = 0; l < kLayers; ++l) {
    values.emplace_back(mine.w[l].begin(), mine.w[l].end());
    values.emplace_back(mine.b[l].begin(), mine.b[l].end());
  }
  std::vector<void*> data;
  for (auto& v : values) data.push_back(v.data());
  sync.prepare(data);
  for (int l = 0; l < kLayers; ++l) {
    for (std::size_t i = 0; i < model.w[l].size(); ++i) {
      if (values[2 * l][i] != static_cast<float>(model.w[l][i]))
        fail("prepare: fc" + std::to_string(l + 1) + ".weight");
    }
  }
  const int shard = batch / world;
  for (int it = 0; it < 3; ++it) {
    const auto samples = make_batch(model, batch, 50 + it);
    auto local = mlp_grads(model, samples, pg.rank() * shard, (pg.rank() + 1) * shard);
    sync.begin_backward();
    for (int l = kLayers - 1; l >= 0; --l) {
      for (int p : {2 * l, 2 * l + 1}) {
        std::vector<float> f(local[p].begin(), local[p].end());
        if (it == 1) {
          sync.set_grad(p, f.data());
        } else {
          std::memcpy(sync.grad_view(p), f.data(), f.size() * sizeof(float));
        }
        sync.mark_ready(p);
      }
    }
    sync.finish();
    auto whole = mlp_grads(model, samples, 0, batch);
    for (std::size_t p = 0; p < whole.size(); ++p) {
      expect_close(sync.grad_view(p), whole[p],
                   "iteration " + std::to_string(it + 1) + " " + sync.param(p).name);
    }
  }
  std::printf("GRADSYNC OK rank=%d world=%d\n", pg.rank(), world);
}

#define C_CHECK(call)                                                    \
  do {                                                                   \
    if ((call) != 0) fail(std::string(#call) + ": " + ddp_last_error()); \
  } while (0)

void run_capi() {
  C_CHECK(ddp_init(nullptr));
  const int rank = ddp_rank(), world = ddp_world_size();
  ddp_param_t ps[2] = {{"w", 100, DDP_FLOAT32, -1, 1}, {"b", 3, DDP_FLOAT64, -1, 1}};
  ddp_grad_sync_options_t options;
  C_CHECK(ddp_grad_sync_default_options(&options));
  options.first_bucket_bytes = 16;
  options.log_every = 0;
  ddp_grad_sync* gs = nullptr;
  C_CHECK(ddp_grad_sync_create(ps, 2, &options, &gs));
  // Two micro-steps: the first without sync. Rank r adds (r + 1) * (step + 1).
  C_CHECK(ddp_grad_sync_zero_grad(gs));
  for (int step = 0; step < 2; ++step) {
    if (step == 0) C_CHECK(ddp_grad_sync_no_sync_begin(gs));
    std::vector<float> w(100, static_cast<float>((rank + 1) * (step + 1)));
    std::vector<double> b(3, (rank + 1) * (step + 1));
    C_CHECK(ddp_grad_sync_add_grad(gs, 1, b.data()));
    C_CHECK(ddp_grad_sync_mark_ready(gs, 1));
    C_CHECK(ddp_grad_sync_add_grad(gs, 0, w.data()));
    C_CHECK(ddp_grad_sync_mark_ready(gs, 0));
    C_CHECK(ddp_grad_sync_finish(gs));
    if (step == 0) C_CHECK(ddp_grad_sync_no_sync_end(gs));
  }
  // mean over ranks of 3 (r + 1) = 3 (world + 1) / 2.
  const double want = 3.0 * (world + 1) / 2;
  void* g = nullptr;
  C_CHECK(ddp_grad_sync_grad(gs, 0, &g));
  for (int i = 0; i < 100; ++i) {
    if (std::abs(static_cast<float*>(g)[i] - want) > 1e-5)
      fail("C API mean of w: " + std::to_string(static_cast<float*>(g)[i]));
  }
  C_CHECK(ddp_grad_sync_grad(gs, 1, &g));
  for (int i = 0; i < 3; ++i) {
    if (std::abs(static_cast<double*>(g)[i] - want) > 1e-12) fail("C API mean of b");
  }
  ddp_grad_sync_stats_t last;
  C_CHECK(ddp_grad_sync_stats(gs, &last, nullptr));
  if (last.synced != 1 || last.iteration != 2) fail("C API stats");
  C_CHECK(ddp_grad_sync_destroy(gs));
  C_CHECK(ddp_shutdown());
  std::printf("GRADSYNC CAPI OK rank=%d\n", rank);
}

void run_unused(ddp::ProcessGroup& pg) {
  ddp::GradSyncOptions options;
  options.log_every = 0;
  ddp::GradSync sync(pg, params(), options);
  for (std::size_t p = 0; p < sync.num_params(); ++p) {
    if (pg.rank() == 1 && sync.param(p).name == "fc2.bias") continue;
    sync.mark_ready(p);
  }
  try {
    sync.finish();
    fail("finish() did not fail");
  } catch (const ddp::Error& e) {
    std::printf("EXPECTED ERROR rank=%d: %s\n", pg.rank(), e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return usage();
  const std::string mode = argv[1];
  if (mode != "equiv" && mode != "capi" && mode != "unused") return usage();
  int rank = 0;
  try {
    rank = ddp::rank();
    if (mode == "capi") {
      run_capi();
      return 0;
    }
    auto pg = ddp::init();
    if (mode == "equiv") run_equiv(*pg);
    if (mode == "unused") run_unused(*pg);
    ddp::shutdown();
    return 0;
  } catch (const CheckFailed& f) {
    std::fprintf(stderr, "GRADSYNC FAILED rank=%d: %s\n", rank, f.what.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "GRADSYNC FAILED rank=%d: %s\n", rank, e.what());
  }
  return 1;
}
