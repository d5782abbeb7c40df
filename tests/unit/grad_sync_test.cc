// GradSync with every rank a thread of this process: Gloo groups over one
// in-memory store (each run under its own prefix), so a world of 4 costs
// milliseconds. The central check is equivalence: N ranks averaging the
// gradients of their shards of a batch end with the gradient one process
// computes on the whole batch, for an MLP whose gradients are computed
// analytically (in double) here.
//
// Why one file of over 1,000 lines: every test shares the reference MLP,
// the thread ranks and the equivalence check above them, and the sections
// (order, layout, accumulation, unused parameters, compression, dtypes,
// checks, prepare, stats, device buckets, the C API) each read on their own.

#include <gtest/gtest.h>

#include "visible_gpus.h"

#include "thread_ranks.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <latch>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddp/bucket_layout.h"
#include "ddp/common/error.h"
#include "ddp/ddp.h"
#include "ddp/ddp_c.h"
#include "ddp/grad_sync.h"
#include "ddp/log.h"
#include "error_of.h"
#include "reference_mlp.h"

#ifdef DDP_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace ddp {
namespace {

using namespace std::chrono_literals;

// ------------------------------------------------------------ ranks as threads

using ::ddp::testing::gloo_options;
using ::ddp::testing::on_ranks;

using ::ddp::testing::error_of;

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ------------------------------------------------------------ an MLP with analytic gradients

// The unit tests' reference model: 7 inputs, hidden 13 and 11, 5 outputs.
const std::vector<int> kMlpSizes = {7, 13, 11, 5};

using ::ddp::testing::backward_order;
using ::ddp::testing::Batch;
using ::ddp::testing::make_batch;
using ::ddp::testing::Mlp;
using ::ddp::testing::mlp_grads;
using ::ddp::testing::mlp_params;

std::vector<float> to_float(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

// How a rank hands a gradient to GradSync.
enum class Path { kView, kSet, kAdd };

void write_grad(GradSync& sync, std::size_t p, const std::vector<double>& g, Path path) {
  std::vector<float> f = to_float(g);
  switch (path) {
    case Path::kView:
      std::copy(f.begin(), f.end(), sync.grad_view(p));
      break;
    case Path::kSet:
      sync.set_grad(p, f.data());
      break;
    case Path::kAdd:
      sync.add_grad(p, f.data());
      break;
  }
}

// float32 results against the double reference: each rank's gradient is
// rounded to float once and the mean adds a few roundings, so 1e-6 absolute
// plus 1e-5 relative is far above the error and far below any real mistake.
constexpr double kAbsTol = 1e-6;
constexpr double kRelTol = 1e-5;

void expect_grads(GradSync& sync, const std::vector<std::vector<double>>& want,
                  const std::string& what) {
  for (std::size_t p = 0; p < want.size(); ++p) {
    const float* got = sync.grad_view(p);
    for (std::size_t i = 0; i < want[p].size(); ++i) {
      double tol = kAbsTol + kRelTol * std::abs(want[p][i]);
      if (std::abs(got[i] - want[p][i]) > tol) {
        ADD_FAILURE() << what << ": " << sync.param(p).name << "[" << i << "] is " << got[i]
                      << ", expected " << want[p][i];
        return;
      }
    }
  }
}

std::vector<float> all_grads(GradSync& sync) {
  std::vector<float> out;
  for (std::size_t p = 0; p < sync.num_params(); ++p) {
    const float* g = sync.grad_view(p);
    out.insert(out.end(), g, g + sync.param(p).count());
  }
  return out;
}

// ------------------------------------------------------------ equivalence

struct EquivalenceCase {
  int world;
  std::size_t cap;
  CommMode mode = CommMode::kOverlap;
};
// What ctest's "# GetParam() = ..." shows, instead of the struct's bytes.
void PrintTo(const EquivalenceCase& c, std::ostream* os) {
  *os << "world " << c.world << ", cap " << c.cap << " B"
      << (c.mode == CommMode::kInline ? ", inline" : "");
}

class Equivalence : public ::testing::TestWithParam<EquivalenceCase> {};

TEST_P(Equivalence, ShardedMeanGradientEqualsWholeBatchGradient) {
  const auto [world, cap, mode] = GetParam();
  const int kBatch = 24;  // divisible by 1, 2 and 4
  const Mlp model = testing::make_mlp(kMlpSizes, 7);
  on_ranks(world, [&](ProcessGroup& pg) {
    GradSyncOptions options;
    options.bucket_cap_bytes = cap;
    options.first_bucket_bytes = 64;
    options.log_every = 0;
    options.comm_mode = mode;
    GradSync sync(pg, mlp_params(model), options);
    EXPECT_EQ(sync.comm_mode(), mode);
    const int shard = kBatch / world;
    // Iteration 1 writes views (and rebuilds the layout), 2 copies in with
    // set_grad, 3 zeroes and accumulates with add_grad.
    const Path paths[] = {Path::kView, Path::kSet, Path::kAdd};
    for (int it = 0; it < 3; ++it) {
      const Batch batch = make_batch(model, kBatch, 100 + it);
      auto mine = mlp_grads(model, batch, pg.rank() * shard, (pg.rank() + 1) * shard);
      if (paths[it] == Path::kAdd) sync.zero_grad();
      sync.begin_backward();
      for (std::size_t p : backward_order(model)) {
        write_grad(sync, p, mine[p], paths[it]);
        sync.mark_ready(p);
      }
      sync.finish();
      expect_grads(sync, mlp_grads(model, batch, 0, kBatch),
                   "rank " + std::to_string(pg.rank()) + " iteration " + std::to_string(it + 1));
      // The layout is rebuilt once, after the first iteration.
      EXPECT_EQ(sync.layout_version(), 1);
      EXPECT_EQ(sync.layout().order, backward_order(model));
      // Inline collectives run on this thread: timed as such, never "overlapped".
      const IterationStats& last = sync.stats().last;
      if (mode == CommMode::kInline && world > 1) {
        EXPECT_GT(last.inline_comm_ms, 0.0);
        EXPECT_EQ(last.overlap_ms, 0.0);
      } else {
        EXPECT_EQ(last.inline_comm_ms, 0.0);
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldsAndCaps, Equivalence,
                         ::testing::Values(EquivalenceCase{1, 48}, EquivalenceCase{1, 1 << 20},
                                           EquivalenceCase{2, 48}, EquivalenceCase{2, 256},
                                           EquivalenceCase{2, 1 << 20}, EquivalenceCase{4, 48},
                                           EquivalenceCase{4, 256}, EquivalenceCase{4, 1 << 20},
                                           EquivalenceCase{1, 48, CommMode::kInline},
                                           EquivalenceCase{2, 48, CommMode::kInline},
                                           EquivalenceCase{4, 256, CommMode::kInline},
                                           EquivalenceCase{4, 1 << 20, CommMode::kInline}),
                         [](const ::testing::TestParamInfo<EquivalenceCase>& info) {
                           // 48 B is smaller than the largest parameter (fc2.weight, 572 B).
                           return "world" + std::to_string(info.param.world) + "_cap" +
                                  std::to_string(info.param.cap) +
                                  (info.param.mode == CommMode::kInline ? "_inline" : "");
                         });

TEST(GradSyncOrder, RandomDifferentReadyOrdersOnEveryRankGiveIdenticalResults) {
  for (auto [world, mode] : {std::pair{2, CommMode::kOverlap}, std::pair{4, CommMode::kOverlap},
                             std::pair{2, CommMode::kInline}, std::pair{4, CommMode::kInline}}) {
    SCOPED_TRACE("world " + std::to_string(world) + ", " + comm_mode_name(mode));
    const int kBatch = 24, kIterations = 5;
    const Mlp model = testing::make_mlp(kMlpSizes, 11);
    std::vector<std::vector<std::vector<float>>> results(
        world, std::vector<std::vector<float>>(kIterations));
    on_ranks(world, [&](ProcessGroup& pg) {
      GradSyncOptions options;
      options.bucket_cap_bytes = 48;  // one bucket per parameter or two: many buckets
      options.first_bucket_bytes = 16;
      options.log_every = 0;
      options.comm_mode = mode;
      GradSync sync(pg, mlp_params(model), options);
      std::mt19937 gen(1000u * static_cast<unsigned>(pg.rank()) + 1);
      const int shard = kBatch / world;
      for (int it = 0; it < kIterations; ++it) {
        const Batch batch = make_batch(model, kBatch, 200 + it);
        auto mine = mlp_grads(model, batch, pg.rank() * shard, (pg.rank() + 1) * shard);
        std::vector<std::size_t> order(mine.size());
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), gen);
        for (std::size_t p : order) {
          write_grad(sync, p, mine[p], Path::kView);
          sync.mark_ready(p);
          if (gen() % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(gen() % 300));
        }
        sync.finish();
        expect_grads(sync, mlp_grads(model, batch, 0, kBatch), "rank " + std::to_string(pg.rank()));
        results[pg.rank()][it] = all_grads(sync);
      }
    });
    for (int r = 1; r < world; ++r) {
      for (int it = 0; it < kIterations; ++it) {
        EXPECT_EQ(results[r][it], results[0][it])
            << "rank " << r << " iteration " << it + 1 << " differs from rank 0";
      }
    }
  }
}

// A peer that never joins: the inline all-reduce that completes the first
// bucket fails at the collective timeout; mark_ready() does not throw, the
// later buckets issue nothing (one timeout in all, not one per bucket), and
// finish() throws the collective's error.
TEST(GradSyncInline, ACollectiveFailureIsThrownByFinishAfterOneTimeout) {
  on_ranks(
      2,
      [](ProcessGroup& pg) {
        GradSyncOptions options;
        options.bucket_cap_bytes = 40;  // one bucket per parameter
        options.first_bucket_bytes = 40;
        options.log_every = 0;
        options.comm_mode = CommMode::kInline;
        GradSync sync(pg, {{"p0", {10}}, {"p1", {10}}, {"p2", {10}}, {"p3", {10}}}, options);
        if (pg.rank() == 1) return;  // never reduces anything
        const auto start = std::chrono::steady_clock::now();
        for (std::size_t p = 0; p < 4; ++p)
          EXPECT_NO_THROW(sync.mark_ready(p)) << "parameter " << p;
        const std::string error = error_of([&] { sync.finish(); });
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        EXPECT_NE(error, "") << "finish() did not throw";
        EXPECT_LT(seconds, 2.5) << "more than one 1 s timeout: " << error;
      },
      gloo_options(std::chrono::seconds(1)));
}

// Four parameters of 10 floats; rank r writes (r + 1) * (p + 1) + i / 2.
std::vector<GradParam> four_params() {
  return {{"p0", {10}}, {"p1", {10}}, {"p2", {10}}, {"p3", {10}}};
}
float four_value(int rank, std::size_t p, std::size_t i) {
  return static_cast<float>((rank + 1) * (p + 1)) + static_cast<float>(i) / 2;
}
// The mean over `world` ranks of four_value.
float four_mean(int world, std::size_t p, std::size_t i) {
  return static_cast<float>((world + 1) * (p + 1)) / 2 + static_cast<float>(i) / 2;
}

TEST(GradSyncLayout, RebuiltOnceFromRankZerosObservedOrderOnEveryRank) {
  on_ranks(2, [](ProcessGroup& pg) {
    GradSyncOptions options;
    options.first_bucket_bytes = 40;
    options.bucket_cap_bytes = 80;
    options.log_every = 0;
    GradSync sync(pg, four_params(), options);
    EXPECT_EQ(sync.layout().order, (std::vector<std::size_t>{3, 2, 1, 0}));
    ASSERT_EQ(sync.layout().buckets.size(), 3u);
    // Rank 0 marks in registration order, rank 1 in reverse.
    const std::vector<std::size_t> order = pg.rank() == 0 ? std::vector<std::size_t>{0, 1, 2, 3}
                                                          : std::vector<std::size_t>{3, 2, 1, 0};
    for (int it = 0; it < 3; ++it) {
      for (std::size_t p : order) {
        float* g = sync.grad_view(p);  // re-fetched every iteration: views move at the rebuild
        for (std::size_t i = 0; i < 10; ++i)
          g[i] = four_value(pg.rank(), p, i) * static_cast<float>(it + 1);
        sync.mark_ready(p);
      }
      sync.finish();
      EXPECT_EQ(sync.layout_version(), 1) << "iteration " << it + 1;
      EXPECT_EQ(sync.layout().order, (std::vector<std::size_t>{0, 1, 2, 3}));
      ASSERT_EQ(sync.layout().buckets.size(), 3u);
      EXPECT_EQ(sync.layout().buckets[0].slots[0].param, 0u);
      // The rebuild kept the averaged values of the iteration it followed.
      for (std::size_t p = 0; p < 4; ++p) {
        const float* g = sync.grad_view(p);
        for (std::size_t i = 0; i < 10; ++i) {
          ASSERT_EQ(g[i], four_mean(2, p, i) * static_cast<float>(it + 1))
              << "p" << p << "[" << i << "]";
        }
      }
    }
  });
}

TEST(GradSyncLayout, SetFirstBucketBytesLaysOutAgainBetweenIterationsKeepingValues) {
  on_ranks(2, [](ProcessGroup& pg) {
    GradSyncOptions options;
    options.first_bucket_bytes = 40;
    options.bucket_cap_bytes = 80;
    options.rebuild_buckets = false;
    options.log_every = 0;
    GradSync sync(pg, four_params(), options);
    ASSERT_EQ(sync.layout().buckets.size(), 3u);
    for (std::size_t p = 0; p < 4; ++p) {
      for (std::size_t i = 0; i < 10; ++i) sync.grad_view(p)[i] = four_value(pg.rank(), p, i);
      sync.mark_ready(p);
    }
    sync.finish();
    EXPECT_EQ(sync.layout_version(), 0);  // rebuild_buckets = false
    sync.set_first_bucket_bytes(1 << 20);
    EXPECT_EQ(sync.layout_version(), 1);
    ASSERT_EQ(sync.layout().buckets.size(), 1u);
    for (std::size_t p = 0; p < 4; ++p) {
      for (std::size_t i = 0; i < 10; ++i) ASSERT_EQ(sync.grad_view(p)[i], four_mean(2, p, i));
    }
    sync.begin_backward();
    EXPECT_TRUE(has(error_of([&] { sync.set_first_bucket_bytes(64); }), "during iteration 2"))
        << "mid-iteration";
    for (std::size_t p = 0; p < 4; ++p) sync.mark_ready(p);
    sync.finish();
  });
}

// ------------------------------------------------------------ accumulation

float micro_value(int rank, int step, std::size_t i) {
  return static_cast<float>(rank + 1) + 10.0f * static_cast<float>(step) +
         0.25f * static_cast<float>(i);
}

TEST(GradSyncAccumulation, NoSyncStepsAccumulateLocallyAndTheSyncedStepReducesTheSum) {
  const int kWorld = 2, kMicro = 3;
  on_ranks(kWorld, [&](ProcessGroup& pg) {
    GradSyncOptions options;
    options.log_every = 0;
    GradSync sync(pg, {{"w", {5}}, {"b", {3}}}, options);
    for (Path path : {Path::kView, Path::kAdd}) {
      SCOPED_TRACE(path == Path::kView ? "views" : "add_grad");
      sync.zero_grad();
      for (int step = 0; step < kMicro; ++step) {
        auto one_step = [&] {
          for (std::size_t p = 0; p < 2; ++p) {
            const std::size_t n = sync.param(p).count();
            std::vector<float> g(n);
            for (std::size_t i = 0; i < n; ++i) g[i] = micro_value(pg.rank(), step, i);
            if (path == Path::kView) {
              float* v = sync.grad_view(p);
              for (std::size_t i = 0; i < n; ++i) v[i] += g[i];
            } else {
              sync.add_grad(p, g.data());
            }
            sync.mark_ready(p);
          }
          sync.finish();
        };
        if (step + 1 < kMicro) {
          auto guard = sync.no_sync();
          EXPECT_FALSE(sync.sync_enabled());
          one_step();
          EXPECT_FALSE(sync.stats().last.synced);
          EXPECT_EQ(sync.stats().last.buckets, 0u);
          if (path == Path::kView) {
            // Nothing was exchanged: the view holds this rank's own sum.
            float own = 0;
            for (int s = 0; s <= step; ++s) own += micro_value(pg.rank(), s, 0);
            EXPECT_EQ(sync.grad_view(0)[0], own);
          }
        } else {
          EXPECT_TRUE(sync.sync_enabled());
          one_step();
          EXPECT_TRUE(sync.stats().last.synced);
        }
      }
      for (std::size_t p = 0; p < 2; ++p) {
        for (std::size_t i = 0; i < sync.param(p).count(); ++i) {
          double want = 0;
          for (int r = 0; r < kWorld; ++r) {
            for (int s = 0; s < kMicro; ++s) want += micro_value(r, s, i);
          }
          want /= kWorld;
          ASSERT_NEAR(sync.grad_view(p)[i], want, 1e-5) << sync.param(p).name << "[" << i << "]";
        }
      }
    }
  });
}

// ------------------------------------------------------------ unused parameters

std::vector<GradParam> three_params() {
  return {{"fc1.weight", {4}}, {"fc2.bias", {4}}, {"fc3.weight", {4}}};
}

TEST(GradSyncUnused, NeverMarkedParameterFailsEveryRankAndTheOwnerNamesIt) {
  std::vector<std::string> errors(2);
  on_ranks(2, [&](ProcessGroup& pg) {
    GradSyncOptions options;
    options.log_every = 0;
    options.first_bucket_bytes = 16;  // one bucket per parameter: fc2.bias in the middle one
    options.bucket_cap_bytes = 16;
    GradSync sync(pg, three_params(), options);
    for (std::size_t p = 0; p < 3; ++p) {
      if (pg.rank() == 1 && p == 1) continue;
      sync.mark_ready(p);
    }
    errors[pg.rank()] = error_of([&] { sync.finish(); });
    // The object stays usable and nobody hangs: a complete iteration works.
    for (std::size_t p = 0; p < 3; ++p) {
      for (std::size_t i = 0; i < 4; ++i) sync.grad_view(p)[i] = static_cast<float>(pg.rank() * 2);
      sync.mark_ready(p);
    }
    sync.finish();
    for (std::size_t p = 0; p < 3; ++p) EXPECT_EQ(sync.grad_view(p)[0], 1.0f);
  });
  EXPECT_TRUE(has(errors[1], "parameters never marked ready on rank 1: 'fc2.bias' (index 1)"))
      << errors[1];
  EXPECT_TRUE(has(errors[1], "find_unused_parameters")) << errors[1];
  EXPECT_TRUE(has(errors[0], "another rank had parameters that were never marked ready"))
      << errors[0];
  EXPECT_TRUE(has(errors[0], "iteration 1")) << errors[0];
}

// ------------------------------------------------------------ needed gradients (ZeRO stage 2)

struct PartialCase {
  const char* backend;
  int world;
  CommMode mode;
};
void PrintTo(const PartialCase& c, std::ostream* os) {
  *os << c.backend << ", world " << c.world
      << (c.mode == CommMode::kInline ? ", inline" : ", overlap");
}
class GradSyncPartial : public ::testing::TestWithParam<PartialCase> {};

ProcessGroupOptions options_for(const char* backend) {
  ProcessGroupOptions o = gloo_options();
  o.backend = backend;
  return o;
}

// Each rank names the elements it reads (a contiguous share of every
// parameter, as ParamShards owns them); those hold exactly the bits a full
// GradSync gives, through every bucket, iteration and layout rebuild.
TEST_P(GradSyncPartial, NeededElementsHoldTheFullAveragesBits) {
  const auto [backend, world, mode] = GetParam();
  // Weights past shm's 32 KiB single-copy limit (fc1 51 KB, fc2 120 KB), so
  // their buckets take the in-place partial path; the biases the small one.
  const Mlp model = testing::make_mlp({64, 200, 150, 10}, 11);
  on_ranks(
      world,
      [&](ProcessGroup& pg) {
        GradSyncOptions options;
        options.bucket_cap_bytes = 256;
        options.first_bucket_bytes = 64;
        options.log_every = 0;
        options.comm_mode = mode;
        GradSync full(pg, mlp_params(model), options), partial(pg, mlp_params(model), options);
        std::vector<ElementRange> mine;
        for (std::size_t p = 0; p < partial.num_params(); ++p) {
          const std::size_t c = partial.param(p).count();
          mine.push_back({c * pg.rank() / world, c * (pg.rank() + 1) / world});
        }
        partial.set_needed_gradients(mine);
        EXPECT_TRUE(partial.partial());
        const int shard = 24 / world;
        for (int it = 0; it < 3; ++it) {
          const Batch batch = make_batch(model, 24, 300 + it);
          auto grads = mlp_grads(model, batch, pg.rank() * shard, (pg.rank() + 1) * shard);
          for (GradSync* sync : {&full, &partial}) {
            sync->begin_backward();
            for (std::size_t p : backward_order(model)) {
              write_grad(*sync, p, grads[p], Path::kView);
              sync->mark_ready(p);
            }
            sync->finish();
          }
          for (std::size_t p = 0; p < partial.num_params(); ++p) {
            const float* a = full.grad_view(p);
            const float* b = partial.grad_view(p);
            for (std::size_t i = mine[p].begin; i < mine[p].end; ++i) {
              ASSERT_EQ(std::memcmp(&a[i], &b[i], sizeof(float)), 0)
                  << "rank " << pg.rank() << " iteration " << it + 1 << " " << partial.param(p).name
                  << "[" << i << "]: " << b[i] << " against " << a[i];
            }
          }
        }
        EXPECT_EQ(partial.layout_version(), 1);  // rebuilt once, as the full one
      },
      options_for(backend));
}

INSTANTIATE_TEST_SUITE_P(Backends, GradSyncPartial,
                         ::testing::Values(PartialCase{"shm", 2, CommMode::kOverlap},
                                           PartialCase{"shm", 2, CommMode::kInline},
                                           PartialCase{"shm", 3, CommMode::kOverlap},
                                           PartialCase{"shm", 4, CommMode::kInline},
                                           PartialCase{"gloo", 3, CommMode::kOverlap}),
                         [](const ::testing::TestParamInfo<PartialCase>& info) {
                           return std::string(info.param.backend) + "_world" +
                                  std::to_string(info.param.world) +
                                  (info.param.mode == CommMode::kInline ? "_inline" : "");
                         });

// The unused-parameter status still reaches every rank (it travels apart from
// the partial reductions), and wrong ranges are refused naming what is wrong.
TEST(GradSyncPartialChecks, UnusedParametersFailEveryRankAndBadRangesAreRefused) {
  std::vector<std::string> errors(2);
  on_ranks(
      2,
      [&](ProcessGroup& pg) {
        GradSyncOptions options;
        options.log_every = 0;
        GradSync sync(pg, three_params(), options);
        EXPECT_TRUE(has(error_of([&] {
                          sync.set_needed_gradients({{0, 1}});
                        }),
                        "1 ranges for 3 parameters"));
        EXPECT_TRUE(has(error_of([&] {
                          sync.set_needed_gradients({{0, 1}, {0, 5}, {0, 1}});
                        }),
                        "elements [0, 5) are not within parameter 'fc2.bias' (4 elements)"));
        sync.set_needed_gradients({{0, 2}, {0, 2}, {0, 2}});
        for (std::size_t p = 0; p < 3; ++p) {
          if (pg.rank() == 1 && p == 1) continue;
          sync.mark_ready(p);
        }
        errors[pg.rank()] = error_of([&] { sync.finish(); });
        sync.set_needed_gradients({});
        EXPECT_FALSE(sync.partial());
      },
      options_for("shm"));
  EXPECT_TRUE(has(errors[1], "parameters never marked ready on rank 1: 'fc2.bias'")) << errors[1];
  EXPECT_TRUE(has(errors[0], "another rank had parameters that were never marked ready"))
      << errors[0];
}

TEST(GradSyncUnused, WorldOfOneListsEveryMissingName) {
  auto pg = ProcessGroup::create(0, 1, nullptr, ProcessGroupOptions::of("local"));
  GradSyncOptions options;
  options.log_every = 0;
  GradSync sync(*pg, three_params(), options);
  sync.mark_ready(1);
  std::string e = error_of([&] { sync.finish(); });
  EXPECT_TRUE(has(e, "'fc1.weight' (index 0), 'fc3.weight' (index 2)")) << e;
}

TEST(GradSyncUnused, FindUnusedParametersCountsThemAsZeroWithoutHanging) {
  on_ranks(2, [](ProcessGroup& pg) {
    GradSyncOptions options;
    options.log_every = 0;
    options.find_unused_parameters = true;
    options.first_bucket_bytes = 16;
    GradSync sync(pg, three_params(), options);
    const float mine = static_cast<float>(pg.rank() + 1) * 2;  // 2 and 4: mean 3
    for (int it = 0; it < 4; ++it) {
      // Iteration 1: rank 1 never marks fc2.bias (its view holds garbage) and
      // nobody marks fc3.weight (stale values from before). Later iterations
      // rotate which rank skips which parameter.
      for (std::size_t p = 0; p < 3; ++p) {
        for (std::size_t i = 0; i < 4; ++i) sync.grad_view(p)[i] = 1000;
      }
      for (std::size_t p = 0; p < 3; ++p) {
        const bool skip = (p == 2) || (p == static_cast<std::size_t>(it % 2) &&
                                       pg.rank() == (it % 2 == 0 ? 0 : 1));
        if (skip) continue;
        for (std::size_t i = 0; i < 4; ++i) sync.grad_view(p)[i] = mine;
        sync.mark_ready(p);
      }
      sync.finish();
      for (std::size_t p = 0; p < 3; ++p) {
        const int skipper = it % 2 == 0 ? 0 : 1;
        float want;
        if (p == 2) {
          want = 0;
        } else if (p == static_cast<std::size_t>(it % 2)) {
          want = (skipper == 0 ? 4.0f : 2.0f) / 2;  // only the other rank's value, over 2 ranks
        } else {
          want = 3;
        }
        EXPECT_EQ(sync.grad_view(p)[3], want)
            << "iteration " << it + 1 << " " << sync.param(p).name;
      }
    }
  });
}

// ------------------------------------------------------------ compression

struct CompressionCase {
  int world;
  Compression compression;
};
void PrintTo(const CompressionCase& c, std::ostream* os) {
  *os << compression_name(c.compression) << ", world " << c.world;
}

class CompressionBound : public ::testing::TestWithParam<CompressionCase> {};

TEST_P(CompressionBound, MeanStaysWithinTheRoundingBoundOfTheWireType) {
  const auto [world, compression] = GetParam();
  // |x| <= 1. Dividing by the world size before the conversion costs one
  // rounding of at most u * |x| / N; each of the N - 1 sums in 16 bits one
  // more of at most u * 1 (u = 2^-11 for fp16, 2^-8 for bf16). So the error is
  // at most N * u; we allow twice that.
  const double u = compression == Compression::kFp16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  const double bound = 2 * world * u;
  auto value = [](int rank, std::size_t p, std::size_t i) {
    std::mt19937 gen(static_cast<unsigned>(rank * 7919 + p * 104729 + i));
    return std::uniform_real_distribution<double>(-1, 1)(gen);
  };
  std::vector<GradParam> params = {{"a", {1000}}, {"b", {37}}, {"c", {50}, DType::kFloat64}};
  on_ranks(world, [&](ProcessGroup& pg) {
    GradSyncOptions options;
    options.log_every = 0;
    options.compression = compression;
    GradSync sync(pg, params, options);
    for (std::size_t p = 0; p < params.size(); ++p) {
      for (std::size_t i = 0; i < params[p].count(); ++i) {
        if (params[p].dtype == DType::kFloat32) {
          static_cast<float*>(sync.grad(p))[i] = static_cast<float>(value(pg.rank(), p, i));
        } else {
          static_cast<double*>(sync.grad(p))[i] = value(pg.rank(), p, i);
        }
      }
      sync.mark_ready(p);
    }
    sync.finish();
    EXPECT_EQ(sync.stats().last.bytes_on_wire, 2 * (1000 + 37 + 50 + 1u))
        << "16 bits per element (+ status word)";
    std::size_t inexact = 0;
    double worst = 0;
    for (std::size_t p = 0; p < params.size(); ++p) {
      for (std::size_t i = 0; i < params[p].count(); ++i) {
        double want = 0;
        for (int r = 0; r < world; ++r) want += value(r, p, i);
        want /= world;
        double got = params[p].dtype == DType::kFloat32 ? static_cast<float*>(sync.grad(p))[i]
                                                        : static_cast<double*>(sync.grad(p))[i];
        worst = std::max(worst, std::abs(got - want));
        inexact += std::abs(got - want) > 1e-7 ? 1 : 0;
      }
    }
    EXPECT_LE(worst, bound);
    EXPECT_GT(inexact, 0u) << "nothing was rounded: was the bucket compressed at all?";
  });
}

INSTANTIATE_TEST_SUITE_P(WireTypes, CompressionBound,
                         ::testing::Values(CompressionCase{2, Compression::kFp16},
                                           CompressionCase{4, Compression::kFp16},
                                           CompressionCase{2, Compression::kBf16},
                                           CompressionCase{4, Compression::kBf16}),
                         [](const ::testing::TestParamInfo<CompressionCase>& info) {
                           return std::string(compression_name(info.param.compression)) + "_world" +
                                  std::to_string(info.param.world);
                         });

TEST(GradSyncCompression, WireValuesAreExactlyTheScalarRoundingsOfTheScaledGradients) {
  // With 2 ranks every element is one 16-bit sum of the two ranks' halves:
  // the result must be, bit for bit, what types.h's scalar conversions give
  // (the vectorised conversions included; 1037 is no multiple of 8).
  for (Compression compression : {Compression::kFp16, Compression::kBf16}) {
    SCOPED_TRACE(compression_name(compression));
    const bool half = compression == Compression::kFp16;
    auto to16 = [&](float v) { return half ? float_to_half(v) : float_to_bfloat16(v); };
    auto from16 = [&](std::uint16_t v) { return half ? half_to_float(v) : bfloat16_to_float(v); };
    auto value = [](int rank, std::size_t i) {
      return std::ldexp(static_cast<float>((i * 2654435761u + rank * 40503u) % 20011) - 10005.0f,
                        static_cast<int>(i % 23) - 20);
    };
    on_ranks(2, [&](ProcessGroup& pg) {
      GradSyncOptions options;
      options.log_every = 0;
      options.compression = compression;
      GradSync sync(pg, {{"w", {1037}}}, options);
      for (std::size_t i = 0; i < 1037; ++i) sync.grad_view(0)[i] = value(pg.rank(), i);
      sync.mark_ready(0);
      sync.finish();
      for (std::size_t i = 0; i < 1037; ++i) {
        const float want =
            from16(to16(from16(to16(value(0, i) * 0.5f)) + from16(to16(value(1, i) * 0.5f))));
        ASSERT_EQ(sync.grad_view(0)[i], want) << "element " << i;
      }
    });
  }
}

TEST(GradSyncCompression, Fp16DividesBeforeSummingSoLargeGradientsDoNotOverflow) {
  // 4 x 30000 = 120000 overflows fp16 (max 65504); 4 x 7500 does not.
  on_ranks(4, [](ProcessGroup& pg) {
    GradSyncOptions options;
    options.log_every = 0;
    options.compression = Compression::kFp16;
    GradSync sync(pg, {{"w", {8}}}, options);
    std::fill(sync.grad_view(0), sync.grad_view(0) + 8, 30000.0f);
    sync.mark_ready(0);
    sync.finish();
    for (int i = 0; i < 8; ++i) EXPECT_NEAR(sync.grad_view(0)[i], 30000.0, 30000.0 / 1024);
  });
}

// ------------------------------------------------------------ dtypes

TEST(GradSyncDtypes, EveryFloatingDtypeIsGroupedApartAndAveraged) {
  std::vector<GradParam> params = {{"a", {6}, DType::kFloat32},
                                   {"b", {5}, DType::kFloat64},
                                   {"c", {7}, DType::kFloat16},
                                   {"d", {4}, DType::kBFloat16},
                                   {"e", {3}, DType::kFloat32}};
  auto store = [](void* base, DType dtype, std::size_t i, double v) {
    char* p = static_cast<char*>(base) + i * dtype_size(dtype);
    if (dtype == DType::kFloat32) {
      float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
    } else if (dtype == DType::kFloat64) {
      std::memcpy(p, &v, 8);
    } else {
      std::uint16_t h = dtype == DType::kFloat16 ? float_to_half(static_cast<float>(v))
                                                 : float_to_bfloat16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
    }
  };
  auto load = [](const void* base, DType dtype, std::size_t i) -> double {
    const char* p = static_cast<const char*>(base) + i * dtype_size(dtype);
    if (dtype == DType::kFloat32) {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    if (dtype == DType::kFloat64) {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    std::uint16_t h;
    std::memcpy(&h, p, 2);
    return dtype == DType::kFloat16 ? half_to_float(h) : bfloat16_to_float(h);
  };
  // Exact in every dtype: (r + 1) * k with small k; the mean over 2 ranks is 1.5 * k.
  auto value = [](int rank, std::size_t p, std::size_t i) {
    return (rank + 1) * static_cast<double>(i % 4 + p);
  };
  on_ranks(2, [&](ProcessGroup& pg) {
    GradSyncOptions options;
    options.log_every = 0;
    GradSync sync(pg, params, options);
    for (const auto& b : sync.layout().buckets) {
      for (const auto& s : b.slots)
        EXPECT_EQ(params[s.param].dtype, b.dtype) << params[s.param].name;
    }
    EXPECT_EQ(sync.layout().buckets.size(), 4u);
    for (bool copy_in : {false, true}) {
      SCOPED_TRACE(copy_in ? "set_grad" : "views");
      for (std::size_t p = 0; p < params.size(); ++p) {
        std::vector<char> src(params[p].count() * dtype_size(params[p].dtype));
        void* dst = copy_in ? static_cast<void*>(src.data()) : sync.grad(p);
        for (std::size_t i = 0; i < params[p].count(); ++i)
          store(dst, params[p].dtype, i, value(pg.rank(), p, i));
        if (copy_in) sync.set_grad(p, src.data());
        sync.mark_ready(p);
      }
      sync.finish();
      for (std::size_t p = 0; p < params.size(); ++p) {
        for (std::size_t i = 0; i < params[p].count(); ++i) {
          EXPECT_EQ(load(sync.grad(p), params[p].dtype, i), 1.5 * static_cast<double>(i % 4 + p))
              << params[p].name << "[" << i << "]";
        }
      }
    }
  });
}

// ------------------------------------------------------------ consistency checks

TEST(GradSyncChecks, ParameterMismatchIsReportedOnEveryRankWithTheRankThatHasIt) {
  std::vector<std::string> errors(3);
  on_ranks(3, [&](ProcessGroup& pg) {
    std::vector<GradParam> params = {{"fc.bias", {4}}, {"fc.weight", {4, pg.rank() == 2 ? 6 : 5}}};
    errors[pg.rank()] = error_of([&] { GradSync sync(pg, params); });
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(has(
        errors[r],
        "check_same_params: parameter 1 'fc.weight': rank 2 has shape [4, 6], rank 0 has [4, 5]"))
        << "rank " << r << ": " << errors[r];
  }
}

TEST(GradSyncChecks, DifferentOptionsAreNamedBeforeAnyCollectiveCanMismatch) {
  std::vector<std::string> errors(2);
  on_ranks(2, [&](ProcessGroup& pg) {
    GradSyncOptions options;
    if (pg.rank() == 1) options.bucket_cap_bytes = 2048;
    errors[pg.rank()] = error_of([&] { GradSync sync(pg, three_params(), options); });
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(has(errors[r],
                    "options differ across ranks: rank 1 has bucket_cap_bytes=2048, rank 0 has "
                    "bucket_cap_bytes=26214400"))
        << errors[r];
  }
}

TEST(GradSyncChecks, ALocalProblemIsReportedOnEveryRank) {
  std::vector<std::string> errors(2);
  on_ranks(2, [&](ProcessGroup& pg) {
    std::vector<GradParam> params = three_params();
    if (pg.rank() == 1) params[2].device = 0;  // a device parameter with gloo
    errors[pg.rank()] = error_of([&] { GradSync sync(pg, params); });
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(
        has(errors[r],
            "GradSync: rank 1: parameter 2 'fc3.weight' is on cuda:0, but backend gloo reduces "
            "host memory"))
        << errors[r];
  }
}

TEST(GradSyncChecks, MarkingTwiceInOneIterationNamesTheParameter) {
  auto pg = ProcessGroup::create(0, 1, nullptr, ProcessGroupOptions::of("local"));
  GradSyncOptions options;
  options.log_every = 0;
  GradSync sync(*pg, three_params(), options);
  sync.mark_ready(0);
  std::string e = error_of([&] { sync.mark_ready(0); });
  EXPECT_TRUE(has(e, "parameter 'fc1.weight' (index 0) was already marked ready in iteration 1"))
      << e;
  EXPECT_TRUE(has(e, "call finish()")) << e;
  EXPECT_TRUE(has(error_of([&] { sync.set_grad(0, std::vector<float>(4).data()); }),
                  "already marked ready"));
  sync.mark_ready(1);
  sync.mark_ready(2);
  sync.finish();
  sync.mark_ready(0);  // a new iteration
  sync.mark_ready(1);
  sync.mark_ready(2);
  sync.finish();
}

TEST(GradSyncChecks, BadIndicesFrozenParametersAndMisuseAreNamed) {
  auto pg = ProcessGroup::create(0, 1, nullptr, ProcessGroupOptions::of("local"));
  GradSyncOptions options;
  options.log_every = 0;
  std::vector<GradParam> params = {
      {"w", {3}}, {"steps", {}, DType::kInt64, -1, false}, {"d", {2}, DType::kFloat64}};
  GradSync sync(*pg, params, options);
  EXPECT_EQ(sync.layout().bucket_of[1], BucketLayout::kNone);
  EXPECT_TRUE(has(error_of([&] { sync.mark_ready(9); }),
                  "parameter index 9 is out of range (3 parameters)"));
  EXPECT_TRUE(has(error_of([&] { sync.grad(1); }), "'steps' (index 1) is frozen"));
  EXPECT_TRUE(has(error_of([&] { sync.mark_ready(1); }), "'steps' (index 1) is frozen"));
  EXPECT_TRUE(has(error_of([&] { sync.grad_view(2); }), "'d' is float64, not float32"));
  EXPECT_TRUE(has(error_of([&] { sync.index_of("nope"); }), "no parameter is called 'nope'"));
  EXPECT_EQ(sync.index_of("d"), 2u);
  sync.mark_ready(0);
  EXPECT_TRUE(has(error_of([&] { sync.zero_grad(); }), "zero_grad was called during iteration 1"));
  sync.mark_ready(2);
  sync.finish();
  sync.zero_grad();

  std::vector<GradParam> bad = {{"count", {2}, DType::kInt32}};
  EXPECT_TRUE(has(error_of([&] { GradSync s(*pg, bad); }), "parameter 0 'count' has dtype int32"));
  std::vector<GradParam> twice = {{"x", {1}}, {"x", {1}}};
  EXPECT_TRUE(has(error_of([&] { GradSync s(*pg, twice); }), "names must be unique"));
  GradSyncOptions zero_cap;
  zero_cap.bucket_cap_bytes = 0;
  EXPECT_TRUE(has(error_of([&] { GradSync s(*pg, three_params(), zero_cap); }),
                  "bucket_cap_bytes must be > 0"));
}

// ------------------------------------------------------------ prepare

TEST(GradSyncPrepare, ParametersAndBuffersBecomeRankZerosInSmallChunks) {
  on_ranks(3, [](ProcessGroup& pg) {
    const float r = static_cast<float>(pg.rank());
    std::vector<float> w(10, r), b(3, r * 2);
    std::int64_t steps = pg.rank() + 5;
    std::vector<double> running_mean(4, r * 3);
    std::vector<GradParam> params = {
        {"w", {10}}, {"b", {3}}, {"steps", {}, DType::kInt64, -1, false}};
    GradSyncOptions options;
    options.log_every = 0;
    options.broadcast_chunk_bytes = 16;  // every buffer in several collectives
    GradSync sync(pg, params, options);
    sync.prepare({w.data(), b.data(), &steps},
                 {{running_mean.data(), running_mean.size(), DType::kFloat64}});
    for (float v : w) EXPECT_EQ(v, 0.0f);
    for (float v : b) EXPECT_EQ(v, 0.0f);
    EXPECT_EQ(steps, 5);
    for (double v : running_mean) EXPECT_EQ(v, 0.0);
    EXPECT_TRUE(
        has(error_of([&] { sync.prepare({w.data()}); }), "1 parameter pointers for 3 parameters"));
  });
}

// ------------------------------------------------------------ statistics and logging

TEST(GradSyncStats, FiguresDescribeTheIterationAndRankZeroLogsOnSchedule) {
  std::ostringstream out, err;
  log::set_sinks([&out](std::string_view line) { out << line; },
                 [&err](std::string_view line) { err << line; });
  const int kIterations = 25;
  on_ranks(2, [&](ProcessGroup& pg) {
    GradSyncOptions options;
    options.log_every = 5;
    options.first_bucket_bytes = 16;
    GradSync sync(pg, three_params(), options);
    for (int it = 0; it < kIterations; ++it) {
      sync.begin_backward();
      for (std::size_t p = 0; p < 3; ++p) {
        std::this_thread::sleep_for(1ms);  // "compute"
        sync.mark_ready(p);
      }
      sync.finish();
      GradSyncStats s = sync.stats();
      EXPECT_EQ(s.last.iteration, static_cast<std::uint64_t>(it + 1));
      EXPECT_TRUE(s.last.synced);
      EXPECT_EQ(s.last.buckets, sync.layout().buckets.size());
      EXPECT_EQ(s.last.bytes_on_wire, (12u + 1u) * 4u);
      EXPECT_GE(s.last.backward_compute_ms, 2.5);
      EXPECT_GE(s.last.comm_ms, 0.0);
      EXPECT_GE(s.last.overlap_ms, 0.0);
      EXPECT_LE(s.last.overlap_ms, s.last.comm_ms + 1e-9);
      EXPECT_GE(s.last.exposed_comm_ms, 0.0);
    }
    GradSyncStats s = sync.stats();
    EXPECT_EQ(s.iterations, static_cast<std::uint64_t>(kIterations));
    EXPECT_EQ(s.synced_iterations, static_cast<std::uint64_t>(kIterations));
    EXPECT_EQ(s.mean.iteration, static_cast<std::uint64_t>(kIterations));
    EXPECT_GE(s.mean.backward_compute_ms, 2.5);
  });
  log::reset_sinks();
  std::vector<std::string> logged;
  std::istringstream lines(out.str());
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("GradSync iteration ", 0) == 0)
      logged.push_back(line.substr(19, line.find(':') - 19));
  }
  // Iterations 1-10, then every 5th; only rank 0 logs (each line once).
  EXPECT_EQ(logged, (std::vector<std::string>{"1", "2", "3", "4", "5", "6", "7", "8", "9", "10",
                                              "15", "20", "25"}))
      << out.str();
  EXPECT_TRUE(has(out.str(), "ms, communication")) << out.str();
  std::size_t constructed = 0;
  for (std::size_t at = 0; (at = out.str().find("GradSync: 3 parameters", at)) != std::string::npos;
       ++at)
    ++constructed;
  EXPECT_EQ(constructed, 1u) << out.str();
}

// ------------------------------------------------------------ device buckets (NCCL)

using ::ddp::testing::visible_gpus;

TEST(GradSyncDevice, NcclAveragesDeviceBucketsInPlace) {
#ifndef DDP_HAVE_NCCL
  GTEST_SKIP() << "built without NCCL (CUDA Toolkit/NCCL not found at build time)";
#else
  if (visible_gpus() < 2)
    GTEST_SKIP() << "needs 2 visible GPUs (one per rank); " << visible_gpus() << " visible";
  ProcessGroupOptions options;
  options.backend = "nccl";
  options.timeout = 60s;
  static std::atomic<int> run{0};
  auto store = make_prefix_store(make_memory_store(), "nccl" + std::to_string(run++));
  std::vector<std::thread> threads;
  std::vector<std::string> failures(2);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        (void)cudaSetDevice(r);
        ProcessGroupOptions o = options;
        o.device = r;
        auto pg = ProcessGroup::create(r, 2, store, o);
        std::vector<GradParam> params = {{"w", {1000}, DType::kFloat32, r},
                                         {"b", {10}, DType::kFloat32, r}};
        GradSyncOptions go;
        go.log_every = 0;
        go.first_bucket_bytes = 64;
        GradSync sync(*pg, params, go);
        for (int it = 0; it < 2; ++it) {
          for (std::size_t p = 0; p < 2; ++p) {
            std::vector<float> host(params[p].count(),
                                    static_cast<float>(r + 1) * static_cast<float>(it + 1));
            sync.set_grad(p, host.data());
            sync.mark_ready(p);
          }
          sync.finish();
          for (std::size_t p = 0; p < 2; ++p) {
            std::vector<float> host(params[p].count());
            (void)cudaMemcpy(host.data(), sync.grad(p), host.size() * 4, cudaMemcpyDeviceToHost);
            for (float v : host) {
              if (v != 1.5f * static_cast<float>(it + 1))
                throw Error("wrong mean " + std::to_string(v));
            }
          }
        }
        EXPECT_THROW(sync.add_grad(0, nullptr), Error);
      } catch (const std::exception& e) {
        failures[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
#endif
}

TEST(GradSyncDevice, CompressionIsRefusedForDeviceBuckets) {
#ifndef DDP_HAVE_NCCL
  GTEST_SKIP() << "built without NCCL (CUDA Toolkit/NCCL not found at build time)";
#else
  if (visible_gpus() < 1) GTEST_SKIP() << "no GPU visible";
  auto pg = ProcessGroup::create(0, 1, nullptr, ProcessGroupOptions::of("local"));
  GradSyncOptions options;
  options.compression = Compression::kFp16;
  std::vector<GradParam> params = {{"w", {4}, DType::kFloat32, 0}};
  EXPECT_TRUE(has(error_of([&] { GradSync s(*pg, params, options); }), "not available for device"));
#endif
}

// ------------------------------------------------------------ C API

TEST(GradSyncCApi, EveryOperationInAWorldOfOne) {
  ASSERT_EQ(ddp_init("local"), 0) << ddp_last_error();
  ddp_param_t params[3] = {{"fc.weight", 6, DDP_FLOAT32, -1, 1},
                           {"fc.bias", 2, DDP_FLOAT32, -1, 1},
                           {"steps", 1, DDP_INT64, -1, 0}};
  ddp_grad_sync_options_t options;
  ASSERT_EQ(ddp_grad_sync_default_options(&options), 0);
  EXPECT_EQ(options.bucket_cap_bytes, std::size_t{25} << 20);
  EXPECT_EQ(options.first_bucket_bytes, std::size_t{1} << 20);
  EXPECT_EQ(options.comm_mode, DDP_COMM_OVERLAP);
  options.first_bucket_bytes = 8;
  options.log_every = 0;
  ddp_grad_sync* gs = nullptr;
  options.comm_mode = 7;
  EXPECT_NE(ddp_grad_sync_create(params, 3, &options, &gs), 0);
  EXPECT_TRUE(has(ddp_last_error(), "comm_mode 7 is not a DDP_COMM_* value")) << ddp_last_error();
  options.comm_mode = DDP_COMM_INLINE;
  ASSERT_EQ(ddp_grad_sync_create(params, 3, &options, &gs), 0) << ddp_last_error();
  ASSERT_NE(gs, nullptr);

  float w[6] = {1, 2, 3, 4, 5, 6}, b[2] = {7, 8};
  std::int64_t steps = 3;
  double stat[2] = {0.5, 0.25};
  void* data[3] = {w, b, &steps};
  void* buffers[1] = {stat};
  size_t counts[1] = {2};
  int dtypes[1] = {DDP_FLOAT64};
  EXPECT_EQ(ddp_grad_sync_prepare(gs, data, 3, buffers, counts, dtypes, 1), 0) << ddp_last_error();

  for (int it = 0; it < 2; ++it) {
    EXPECT_EQ(ddp_grad_sync_begin_backward(gs), 0);
    void* g = nullptr;
    ASSERT_EQ(ddp_grad_sync_grad(gs, 0, &g), 0) << ddp_last_error();
    for (int i = 0; i < 6; ++i) static_cast<float*>(g)[i] = static_cast<float>(i + it);
    EXPECT_EQ(ddp_grad_sync_mark_ready(gs, 0), 0);
    EXPECT_EQ(ddp_grad_sync_set_grad(gs, 1, b), 0) << ddp_last_error();
    EXPECT_EQ(ddp_grad_sync_mark_ready(gs, 1), 0);
    EXPECT_EQ(ddp_grad_sync_mark_ready(gs, 1), -1);
    EXPECT_TRUE(has(ddp_last_error(),
                    "ddp_grad_sync_mark_ready: GradSync: mark_ready: parameter 'fc.bias'"))
        << ddp_last_error();
    EXPECT_EQ(ddp_grad_sync_finish(gs), 0) << ddp_last_error();
    ASSERT_EQ(ddp_grad_sync_grad(gs, 0, &g),
              0);  // re-fetched: the layout was rebuilt after iteration 1
    for (int i = 0; i < 6; ++i) EXPECT_EQ(static_cast<float*>(g)[i], static_cast<float>(i + it));
    ASSERT_EQ(ddp_grad_sync_grad(gs, 1, &g), 0);
    EXPECT_EQ(static_cast<float*>(g)[1], 8.0f);
  }
  void* frozen = nullptr;
  EXPECT_EQ(ddp_grad_sync_grad(gs, 2, &frozen), -1);
  EXPECT_TRUE(has(ddp_last_error(), "frozen")) << ddp_last_error();

  // Accumulation: no_sync iterations, then a synced one.
  EXPECT_EQ(ddp_grad_sync_zero_grad(gs), 0);
  EXPECT_EQ(ddp_grad_sync_no_sync_begin(gs), 0);
  EXPECT_EQ(ddp_grad_sync_add_grad(gs, 0, w), 0);
  EXPECT_EQ(ddp_grad_sync_add_grad(gs, 1, b), 0);
  EXPECT_EQ(ddp_grad_sync_mark_ready(gs, 0), 0);
  EXPECT_EQ(ddp_grad_sync_mark_ready(gs, 1), 0);
  EXPECT_EQ(ddp_grad_sync_finish(gs), 0);
  ddp_grad_sync_stats_t last, mean;
  EXPECT_EQ(ddp_grad_sync_stats(gs, &last, &mean), 0);
  EXPECT_EQ(last.synced, 0);
  EXPECT_EQ(last.iteration, 3u);
  EXPECT_EQ(mean.iteration, 2u);
  EXPECT_EQ(ddp_grad_sync_no_sync_end(gs), 0);
  EXPECT_EQ(ddp_grad_sync_add_grad(gs, 0, w), 0);
  EXPECT_EQ(ddp_grad_sync_add_grad(gs, 1, b), 0);
  EXPECT_EQ(ddp_grad_sync_mark_ready(gs, 0), 0);
  EXPECT_EQ(ddp_grad_sync_mark_ready(gs, 1), 0);
  EXPECT_EQ(ddp_grad_sync_finish(gs), 0);
  EXPECT_EQ(ddp_grad_sync_stats(gs, &last, nullptr), 0);
  EXPECT_EQ(last.synced, 1);
  void* g = nullptr;
  ASSERT_EQ(ddp_grad_sync_grad(gs, 0, &g), 0);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(static_cast<float*>(g)[i], 2 * w[i]);

  // Needed gradients: checked like the C++ call; a world of one reduces nothing anyway.
  size_t begins[3] = {0, 0, 0}, ends[3] = {3, 2, 1};
  EXPECT_EQ(ddp_grad_sync_set_needed_gradients(gs, begins, ends, 2), -1);
  EXPECT_TRUE(has(ddp_last_error(), "2 ranges for 3 parameters")) << ddp_last_error();
  ends[0] = 7;
  EXPECT_EQ(ddp_grad_sync_set_needed_gradients(gs, begins, ends, 3), -1);
  EXPECT_TRUE(has(ddp_last_error(), "elements [0, 7) are not within parameter 'fc.weight'"))
      << ddp_last_error();
  EXPECT_EQ(ddp_grad_sync_set_needed_gradients(gs, nullptr, nullptr, 3), -1);
  ends[0] = 3;
  EXPECT_EQ(ddp_grad_sync_set_needed_gradients(gs, begins, ends, 3), 0) << ddp_last_error();
  EXPECT_EQ(ddp_grad_sync_set_needed_gradients(gs, nullptr, nullptr, 0), 0) << ddp_last_error();

  // The first bucket's cap at run time: a new layout (version +1), the views
  // move, and a synced iteration still leaves the averaged gradients in them.
  int version_before = -1, version_after = -1;
  EXPECT_EQ(ddp_grad_sync_layout_version(gs, nullptr), -1);
  EXPECT_EQ(ddp_grad_sync_layout_version(gs, &version_before), 0) << ddp_last_error();
  EXPECT_EQ(ddp_grad_sync_set_first_bucket_bytes(gs, 0), -1);
  EXPECT_TRUE(has(
      ddp_last_error(),
      "ddp_grad_sync_set_first_bucket_bytes: GradSync: set_first_bucket_bytes: bytes must be > 0"))
      << ddp_last_error();
  EXPECT_EQ(ddp_grad_sync_set_first_bucket_bytes(gs, size_t{1} << 20), 0)
      << ddp_last_error();  // was 8: now one bucket
  EXPECT_EQ(ddp_grad_sync_layout_version(gs, &version_after), 0);
  EXPECT_EQ(version_after, version_before + 1);
  EXPECT_EQ(ddp_grad_sync_set_grad(gs, 0, w), 0);
  EXPECT_EQ(ddp_grad_sync_set_grad(gs, 1, b), 0);
  EXPECT_EQ(ddp_grad_sync_mark_ready(gs, 0), 0);
  EXPECT_EQ(ddp_grad_sync_mark_ready(gs, 1), 0);
  EXPECT_EQ(ddp_grad_sync_finish(gs), 0) << ddp_last_error();
  ASSERT_EQ(ddp_grad_sync_grad(gs, 0, &g), 0);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(static_cast<float*>(g)[i], w[i]);
  ASSERT_EQ(ddp_grad_sync_grad(gs, 1, &g), 0);
  EXPECT_EQ(static_cast<float*>(g)[1], b[1]);

  // A parameter never marked: the error names it.
  EXPECT_EQ(ddp_grad_sync_mark_ready(gs, 0), 0);
  EXPECT_EQ(ddp_grad_sync_finish(gs), -1);
  EXPECT_TRUE(has(ddp_last_error(), "'fc.bias' (index 1)")) << ddp_last_error();

  EXPECT_EQ(ddp_grad_sync_destroy(gs), 0);
  EXPECT_EQ(ddp_grad_sync_destroy(nullptr), 0);
  EXPECT_EQ(ddp_grad_sync_mark_ready(nullptr, 0), -1);
  EXPECT_TRUE(has(ddp_last_error(), "handle is NULL")) << ddp_last_error();
  EXPECT_EQ(ddp_grad_sync_create(params, 3, nullptr, nullptr), -1);
  ddp_param_t bad = {"x", 1, 99, -1, 1};
  EXPECT_EQ(ddp_grad_sync_create(&bad, 1, nullptr, &gs), -1);
  EXPECT_TRUE(has(ddp_last_error(), "dtype 99")) << ddp_last_error();
  EXPECT_EQ(ddp_shutdown(), 0);
}

}  // namespace
}  // namespace ddp
