// A worker for GradSync's integration tests, run under ddprun (or alone, as a
// world of one). Modes (see usage()):
//   equiv   every rank computes the gradients of an MLP on its shard of a
//           batch; GradSync's averages must equal the whole batch's gradient
//           (computed here in double). Prints "GRADSYNC OK rank=R world=N".
//   capi    the same kind of check through the C API (ddp_c.h), with
//           accumulation; prints "GRADSYNC CAPI OK rank=R".
//   unused  rank 1 never marks 'fc2.bias': every rank prints
//           "EXPECTED ERROR rank=R: <error>" and exits 0.
//   shared  equiv with CommMode::kShared (run it under shm): gradients handed
//           over block by block and with set_grad, an accumulation window;
//           prints "GRADSYNC SHARED OK rank=R world=N".
//   capi_shared  the C API's DDP_COMM_SHARED: ddp_grad_sync_contribute with
//           a writer, accumulation, a writer that fails on rank 1; prints
//           "GRADSYNC CAPI SHARED OK rank=R".
//   capi_shards  the C API's ddp_param_shards (ZeRO stage 1): every element
//           of three parameters (odd sizes, two dtypes) updated by exactly
//           one rank, then all-gathered; a state buffer too; bad calls fail
//           naming what is wrong; prints "SHARDS CAPI OK rank=R node_shared=S".
//   shared_kill  rank 1 kills itself (SIGKILL) while it holds a block of the
//           shared sum; the others ignore SIGTERM and print "EXPECTED ERROR
//           rank=R: <error>" when their wait for that block fails.
// A failed check prints "GRADSYNC FAILED rank=R: <what>" on stderr, exit 1.

#include <signal.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/ddp.h"
#include "ddp/ddp_c.h"
#include "ddp/grad_sync.h"
#include "ddp/shared_grad_sum.h"
#include "reference_mlp.h"

namespace {

int usage() {
  std::fprintf(
      stderr,
      "usage: grad_sync_worker equiv|capi|unused|shared|capi_shared|capi_shards|shared_kill\n");
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

// After finish() of iteration `it`: every gradient is the whole batch's
// (`batch` samples), as one process computes it.
void expect_whole_batch_gradient(ddp::GradAverager& sync, const Mlp& model,
                                 const ddp::testing::Batch& samples, int batch, int it) {
  const auto whole = mlp_grads(model, samples, 0, batch);
  for (std::size_t p = 0; p < whole.size(); ++p) {
    expect_close(sync.grad_view(p), whole[p],
                 "iteration " + std::to_string(it + 1) + " " + sync.param(p).name);
  }
}

// prepare() with this rank's weights `mine` (rank 0's are `model`'s): every
// rank must then hold `model`'s values.
void prepare_from_rank0(ddp::GradAverager& sync, const Mlp& model, const Mlp& mine) {
  std::vector<std::vector<float>> values;
  for (int l = 0; l < kLayers; ++l) {
    values.emplace_back(mine.w[l].begin(), mine.w[l].end());
    values.emplace_back(mine.b[l].begin(), mine.b[l].end());
  }
  std::vector<void*> data;
  for (auto& v : values) data.push_back(v.data());
  sync.prepare(data);
  for (int l = 0; l < kLayers; ++l) {
    const std::string layer = "prepare: fc" + std::to_string(l + 1);
    for (std::size_t i = 0; i < model.w[l].size(); ++i) {
      if (values[2 * l][i] != static_cast<float>(model.w[l][i])) fail(layer + ".weight");
    }
    for (std::size_t i = 0; i < model.b[l].size(); ++i) {
      if (values[2 * l + 1][i] != static_cast<float>(model.b[l][i])) fail(layer + ".bias");
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
  prepare_from_rank0(sync, model, mine);
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
    expect_whole_batch_gradient(sync, model, samples, batch, it);
  }
  std::printf("GRADSYNC OK rank=%d world=%d\n", pg.rank(), world);
}

#define C_CHECK(call)                                                    \
  do {                                                                   \
    if ((call) != 0) fail(std::string(#call) + ": " + ddp_last_error()); \
  } while (0)

// The C API modes' parameters, w (100 float32) and b (3 float64), after
// rank r added (r + 1) * (step + 1) over steps 0 and 1: the mean over ranks
// of 3 (r + 1) = 3 (world + 1) / 2 everywhere.
void expect_c_means(ddp_grad_sync* gs, int world, const std::string& what) {
  const double want = 3.0 * (world + 1) / 2;
  void* g = nullptr;
  C_CHECK(ddp_grad_sync_grad(gs, 0, &g));
  for (int i = 0; i < 100; ++i) {
    if (std::abs(static_cast<float*>(g)[i] - want) > 1e-5)
      fail(what + " mean of w: " + std::to_string(static_cast<float*>(g)[i]));
  }
  C_CHECK(ddp_grad_sync_grad(gs, 1, &g));
  for (int i = 0; i < 3; ++i) {
    if (std::abs(static_cast<double*>(g)[i] - want) > 1e-12) fail(what + " mean of b");
  }
}

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
  expect_c_means(gs, world, "C API");
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

// Hands gradient g over block by block, as a GEMM with beta would.
void contribute_blocks(ddp::SharedGradSum& sync, std::size_t p, const std::vector<double>& g) {
  sync.contribute(p, [&](const ddp::GradBlock& b) {
    float* out = static_cast<float*>(b.data);
    const std::size_t first = static_cast<std::size_t>(b.row_begin) * b.row_elements;
    for (std::size_t i = 0; i < static_cast<std::size_t>(b.rows) * b.row_elements; ++i) {
      const float v = b.scale * static_cast<float>(g[first + i]);
      out[i] = b.accumulate ? out[i] + v : v;
    }
  });
}

ddp::GradSyncOptions shared_options() {
  ddp::GradSyncOptions options;
  options.comm_mode = ddp::CommMode::kShared;
  options.shared_block_bytes = 64;  // several blocks per weight
  options.log_every = 0;
  return options;
}

void run_shared(ddp::ProcessGroup& pg) {
  const int world = pg.size(), batch = 12 * world, shard = 12;
  const Mlp model = make_mlp(kSizes, 3);
  Mlp mine = model;
  if (pg.rank() != 0) {
    for (auto& b : mine.b) {
      for (auto& v : b) v -= pg.rank();
    }
  }
  ddp::SharedGradSum sync(pg, params(), shared_options());
  prepare_from_rank0(sync, model, mine);
  for (int it = 0; it < 4; ++it) {
    // Iteration 3 (it == 2) is a window of two micro-batches, each half the shard.
    const auto samples = make_batch(model, batch, 70 + it);
    const int micro = it == 2 ? 2 : 1;
    for (int m = 0; m < micro; ++m) {
      const int from = pg.rank() * shard + m * shard / micro;
      auto local = mlp_grads(model, samples, from, from + shard / micro);
      std::optional<ddp::GradAverager::NoSync> no_sync;
      if (m + 1 < micro) no_sync.emplace(sync);
      sync.begin_backward();
      for (int l = kLayers - 1; l >= 0; --l) {
        for (int p : {2 * l, 2 * l + 1}) {
          // Micro-batch gradients are means over their half: halve them to sum to the shard's.
          if (micro > 1) {
            for (auto& v : local[p]) v /= micro;
          }
          if (it == 1) {
            std::vector<float> f(local[p].begin(), local[p].end());
            sync.set_grad(p, f.data());
          } else {
            contribute_blocks(sync, p, local[p]);
          }
        }
      }
      sync.finish();
    }
    expect_whole_batch_gradient(sync, model, samples, batch, it);
  }
  std::printf("GRADSYNC SHARED OK rank=%d world=%d\n", pg.rank(), world);
}

struct CWriterData {
  float value;
  int fail_with;
};

int c_writer(const ddp_grad_block_t* block, void* user) {
  const auto* d = static_cast<const CWriterData*>(user);
  if (d->fail_with != 0) return d->fail_with;
  float* out = static_cast<float*>(block->data);
  for (int64_t i = 0; i < block->rows * static_cast<int64_t>(block->row_elements); ++i)
    out[i] = block->accumulate ? out[i] + block->scale * d->value : block->scale * d->value;
  return 0;
}

void run_capi_shared() {
  C_CHECK(ddp_init(nullptr));
  const int rank = ddp_rank(), world = ddp_world_size();
  ddp_param_t ps[2] = {{"w", 100, DDP_FLOAT32, -1, 1}, {"b", 3, DDP_FLOAT64, -1, 1}};
  ddp_grad_sync_options_t options;
  C_CHECK(ddp_grad_sync_default_options(&options));
  if (options.shared_block_bytes != 256 * 1024) fail("C API default shared_block_bytes");
  options.comm_mode = DDP_COMM_SHARED;
  options.shared_block_bytes = 64;
  options.log_every = 0;
  ddp_grad_sync* gs = nullptr;
  C_CHECK(ddp_grad_sync_create(ps, 2, &options, &gs));
  // Two micro-steps, the first without sync. Rank r adds (r + 1) * (step + 1).
  for (int step = 0; step < 2; ++step) {
    if (step == 0) C_CHECK(ddp_grad_sync_no_sync_begin(gs));
    CWriterData d{static_cast<float>((rank + 1) * (step + 1)), 0};
    std::vector<double> b(3, (rank + 1) * (step + 1));
    C_CHECK(ddp_grad_sync_add_grad(gs, 1, b.data()));
    C_CHECK(ddp_grad_sync_contribute(gs, 0, c_writer, &d));
    C_CHECK(ddp_grad_sync_finish(gs));
    if (step == 0) C_CHECK(ddp_grad_sync_no_sync_end(gs));
  }
  expect_c_means(gs, world, "C API shared");
  // A writer that fails on rank 1: that rank's contribute fails naming it,
  // and every rank's finish() fails without waiting for the timeout.
  CWriterData bad{1.0f, rank == 1 ? 5 : 0};
  const int contributed = ddp_grad_sync_contribute(gs, 0, c_writer, &bad);
  if (rank == 1 && (contributed == 0 || std::strstr(ddp_last_error(), "returned 5") == nullptr))
    fail(std::string("C API failing writer: ") + ddp_last_error());
  if (rank != 1 && contributed != 0) fail(std::string("C API writer: ") + ddp_last_error());
  std::vector<double> b(3, 1.0);
  C_CHECK(ddp_grad_sync_add_grad(gs, 1, b.data()));
  if (ddp_grad_sync_finish(gs) == 0) fail("C API finish after a failed writer succeeded");
  if (std::strstr(ddp_last_error(), "'w' (index 0)") == nullptr)
    fail(std::string("C API finish error: ") + ddp_last_error());
  if (ddp_grad_sync_mark_ready(gs, 0) == 0 ||
      std::strstr(ddp_last_error(), "contribute()") == nullptr) {
    fail(std::string("C API mark_ready in shared mode: ") + ddp_last_error());
  }
  C_CHECK(ddp_grad_sync_destroy(gs));
  C_CHECK(ddp_shutdown());
  std::printf("GRADSYNC CAPI SHARED OK rank=%d\n", rank);
}

void run_capi_shards() {
  C_CHECK(ddp_init(nullptr));
  const int rank = ddp_rank(), world = ddp_world_size();
  ddp_param_t ps[3] = {{"w", 1001, DDP_FLOAT32, -1, 1},
                       {"b", 7, DDP_FLOAT64, -1, 1},
                       {"frozen", 1, DDP_FLOAT32, -1, 0}};
  ddp_param_shards* shards = nullptr;
  C_CHECK(ddp_param_shards_create(ps, 3, &shards));
  int node_shared = -1;
  C_CHECK(ddp_param_shards_node_shared(shards, &node_shared));
  // The values: element i of parameter p is 10 * p + i, written by one rank
  // when the buffer is the node's one copy, else by every rank.
  auto value = [](std::size_t p, std::size_t i) {
    return 10.0 * static_cast<double>(p) + static_cast<double>(i);
  };
  std::vector<void*> data(3);
  for (std::size_t p = 0; p < 3; ++p) C_CHECK(ddp_param_shards_data(shards, p, &data[p]));
  if (!node_shared || rank == 0) {
    for (std::size_t p = 0; p < 3; ++p) {
      for (std::size_t i = 0; i < ps[p].count; ++i) {
        if (ps[p].dtype == DDP_FLOAT64)
          static_cast<double*>(data[p])[i] = value(p, i);
        else
          static_cast<float*>(data[p])[i] = static_cast<float>(value(p, i));
      }
    }
  }
  C_CHECK(ddp_barrier());
  // Each rank adds 1000 * (rank + 1) to the elements it owns, and marks them
  // in a private state buffer, then both are gathered: every element must
  // carry exactly one owner's mark, the same on every rank.
  std::vector<std::vector<double>> state(3);
  std::vector<void*> state_ptrs(3);
  for (std::size_t p = 0; p < 3; ++p) {
    std::size_t begin = 0, end = 0;
    C_CHECK(ddp_param_shards_owned(shards, p, &begin, &end));
    if (begin > end || end > ps[p].count)
      fail("C API owned range of parameter " + std::to_string(p));
    for (std::size_t i = begin; i < end; ++i) {
      if (ps[p].dtype == DDP_FLOAT64)
        static_cast<double*>(data[p])[i] += 1000.0 * (rank + 1);
      else
        static_cast<float*>(data[p])[i] += 1000.0f * static_cast<float>(rank + 1);
    }
    state[p].assign(ps[p].count, 0.0);
    for (std::size_t i = begin; i < end; ++i) state[p][i] = rank + 1;
    state_ptrs[p] = p == 1 ? state[p].data() : nullptr;  // only 'b' has state (float64, like it)
  }
  C_CHECK(ddp_param_shards_all_gather(shards));
  C_CHECK(ddp_param_shards_all_gather_buffers(shards, state_ptrs.data(), 3));
  double checksum = 0;
  for (std::size_t p = 0; p < 3; ++p) {
    for (std::size_t i = 0; i < ps[p].count; ++i) {
      const double got = ps[p].dtype == DDP_FLOAT64 ? static_cast<double*>(data[p])[i]
                                                    : static_cast<float*>(data[p])[i];
      const double added = got - value(p, i);
      const long owner = std::lround(added / 1000.0) - 1;
      if (owner < 0 || owner >= world || std::fabs(added - 1000.0 * (owner + 1)) > 1e-3) {
        fail("parameter " + std::to_string(p) + " element " + std::to_string(i) + " is " +
             std::to_string(got) + ": not updated by exactly one rank");
      }
      if (p == 1 && state[p][i] != owner + 1) {
        fail("state of 'b' element " + std::to_string(i) + " is " + std::to_string(state[p][i]) +
             ", its owner is rank " + std::to_string(owner));
      }
      checksum += got * static_cast<double>(i + 1);
    }
  }
  double extremes[2] = {checksum, -checksum};
  C_CHECK(ddp_all_reduce(extremes, 2, DDP_FLOAT64, DDP_MAX));
  if (extremes[0] != checksum || -extremes[1] != checksum)
    fail("the ranks hold different parameters");
  // Misuse fails with a message naming what is wrong.
  void* nowhere = nullptr;
  if (ddp_param_shards_data(shards, 3, &nowhere) == 0 ||
      std::strstr(ddp_last_error(), "3") == nullptr)
    fail(std::string("C API data(3): ") + ddp_last_error());
  if (ddp_param_shards_all_gather_buffers(shards, state_ptrs.data(), 2) == 0 ||
      std::strstr(ddp_last_error(), "2 buffers for 3 parameters") == nullptr)
    fail(std::string("C API all_gather_buffers(2): ") + ddp_last_error());
  if (ddp_param_shards_all_gather(nullptr) == 0 || std::strstr(ddp_last_error(), "NULL") == nullptr)
    fail(std::string("C API all_gather(NULL): ") + ddp_last_error());
  C_CHECK(ddp_param_shards_destroy(shards));
  C_CHECK(ddp_shutdown());
  std::printf("SHARDS CAPI OK rank=%d node_shared=%d\n", rank, node_shared);
}

void run_shared_kill(ddp::ProcessGroup& pg) {
  // The survivors must live to report: ddprun's SIGKILL comes only after its
  // shutdown timeout.
  signal(SIGTERM, SIG_IGN);
  ddp::GradSyncOptions options = shared_options();
  options.shared_block_bytes = 1 << 20;  // one block per parameter: the others must wait for it
  ddp::SharedGradSum sync(pg, params(), options);
  for (int it = 0;; ++it) {
    try {
      // In iteration 3 rank 1 dies holding the first parameter's block. The
      // barrier (rank 1's inside its writer) makes sure it holds the block
      // before the others reach it, so they find a dead holder every time.
      const bool dying = it == 2 && pg.rank() == 1;
      if (it == 2 && !dying) pg.barrier();
      for (std::size_t p = 0; p < sync.num_params(); ++p) {
        sync.contribute(p, [&](const ddp::GradBlock& b) {
          if (dying) {
            pg.barrier();
            raise(SIGKILL);
          }
          float* out = static_cast<float*>(b.data);
          for (std::size_t i = 0; i < static_cast<std::size_t>(b.rows) * b.row_elements; ++i)
            out[i] = b.accumulate ? out[i] + b.scale : b.scale;
        });
      }
      sync.finish();
    } catch (const ddp::Error& e) {
      std::printf("EXPECTED ERROR rank=%d: %s\n", pg.rank(), e.what());
      std::fflush(stdout);
      std::_Exit(3);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return usage();
  const std::string mode = argv[1];
  if (mode != "equiv" && mode != "capi" && mode != "unused" && mode != "shared" &&
      mode != "capi_shared" && mode != "capi_shards" && mode != "shared_kill") {
    return usage();
  }
  int rank = 0;
  try {
    rank = ddp::rank();
    if (mode == "capi") {
      run_capi();
      return 0;
    }
    if (mode == "capi_shared") {
      run_capi_shared();
      return 0;
    }
    if (mode == "capi_shards") {
      run_capi_shards();
      return 0;
    }
    auto pg = ddp::init();
    if (mode == "equiv") run_equiv(*pg);
    if (mode == "unused") run_unused(*pg);
    if (mode == "shared") run_shared(*pg);
    if (mode == "shared_kill") run_shared_kill(*pg);
    ddp::shutdown();
    return 0;
  } catch (const CheckFailed& f) {
    std::fprintf(stderr, "GRADSYNC FAILED rank=%d: %s\n", rank, f.what.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "GRADSYNC FAILED rank=%d: %s\n", rank, e.what());
  }
  return 1;
}
