// GradSync with every rank a thread of this process: Gloo groups over one
// in-memory store (each run under its own prefix), so a world of 4 costs
// milliseconds. The central check is equivalence: N ranks averaging the
// gradients of their shards of a batch end with the gradient one process
// computes on the whole batch, for an MLP whose gradients are computed
// analytically (in double). Then ready order, inline mode, the bucket layout,
// accumulation, unused parameters and needed gradients (ZeRO stage 2).

#include "grad_sync_test_support.h"

namespace ddp {
namespace {

using namespace ::ddp::grad_sync_test;
using namespace std::chrono_literals;

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

}  // namespace
}  // namespace ddp
