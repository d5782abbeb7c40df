// GradSync's hand-over by writing (contribute) and its lazily zeroed host
// buckets: a gradient reads zeros until written, even where the bucket
// memory held another GradSync's values, and is never zeroed where the
// first hand-over stores.

#include "grad_sync_test_support.h"
#include "unique_run_id.h"

namespace ddp::grad_sync_test {
namespace {

using ::ddp::testing::unique_run_id;

ProcessGroupOptions shm_options(const std::string& run_id) {
  ProcessGroupOptions o;
  o.backend = "shm";
  o.timeout = 20s;
  o.run_id = run_id;
  return o;
}

std::vector<GradParam> four_params() {
  return {{"w", {3, 4}}, {"b", {3}}, {"unmarked", {5}}, {"marked_only", {6}}};
}

// The write of a contribute() test: stores or adds `value` times block.scale.
std::function<void(const GradBlock&)> write_of(float value, std::vector<GradBlock>* seen) {
  return [value, seen](const GradBlock& b) {
    seen->push_back(b);
    auto* f = static_cast<float*>(b.data);
    const std::size_t n = static_cast<std::size_t>(b.rows) * b.row_elements;
    for (std::size_t i = 0; i < n; ++i) f[i] = (b.accumulate ? f[i] : 0.0f) + value * b.scale;
  };
}

TEST(GradSyncContribute, AGradientReadsZerosUntilWrittenWhereTheMemoryHeldAnotherSyncsValues) {
  const std::string run = unique_run_id("contrib");
  GradSyncOptions options;
  options.log_every = 0;
  options.find_unused_parameters = true;
  on_ranks(
      2,
      [&](ProcessGroup& pg) {
        std::size_t bucket_bytes = 0;
        {
          GradSync first(pg, four_params(), options);
          for (std::size_t p = 0; p < 4; ++p) {
            std::vector<float> sevens(first.param(p).count(), 7.0f);
            first.set_grad(p, sevens.data());
            first.mark_ready(p);
          }
          first.finish();
          bucket_bytes = first.layout().total_bytes();
        }
        {
          // What the next allocation of that size holds: the last one's values.
          auto reused = pg.allocate(bucket_bytes);
          const auto* f = static_cast<const float*>(reused.get());
          ASSERT_EQ(f[0], 7.0f) << "this check needs memory that was not zeroed in between";
        }
        GradSync sync(pg, four_params(), options);
        std::vector<GradBlock> seen;
        float before_write = -1;
        sync.contribute(0, [&](const GradBlock& b) {
          before_write = static_cast<const float*>(b.data)[0];
          write_of(2.0f, &seen)(b);
        });
        EXPECT_EQ(before_write, 7.0f)
            << "a gradient the first hand-over stores is not zeroed first";
        sync.contribute(1, write_of(4.0f, &seen));
        ASSERT_EQ(seen.size(), 2u);
        EXPECT_FALSE(seen[0].accumulate) << "the first hand-over of a window stores";
        EXPECT_EQ(seen[0].rows, 3);
        EXPECT_EQ(seen[0].row_elements, 4u);
        EXPECT_EQ(seen[0].row_begin, 0);
        EXPECT_EQ(seen[0].scale, 0.5f) << "grad_scale() of 2 ranks";
        EXPECT_EQ(seen[1].rows, 3);
        EXPECT_EQ(seen[1].row_elements, 1u);
        EXPECT_EQ(sync.grad_view(3)[5], 0.0f) << "a view never written reads zeros";
        sync.mark_ready(3);
        sync.finish();  // "unmarked" counts as zero
        for (std::size_t i = 0; i < 12; ++i) EXPECT_FLOAT_EQ(sync.grad_view(0)[i], 2.0f);
        for (std::size_t i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(sync.grad_view(1)[i], 4.0f);
        for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(sync.grad_view(2)[i], 0.0f) << i;
        for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(sync.grad_view(3)[i], 0.0f) << i;
      },
      shm_options(run));
}

TEST(GradSyncContribute, AddingToAGradientNeverWrittenStoresAndMarkingItAloneGivesZeros) {
  const std::string run = unique_run_id("contrib");
  GradSyncOptions options;
  options.log_every = 0;
  on_ranks(
      2,
      [&](ProcessGroup& pg) {
        {
          GradSync first(pg, {{"a", {64}}, {"m", {64}}}, options);
          for (std::size_t p = 0; p < 2; ++p) {
            std::vector<float> nines(64, 9.0f);
            first.set_grad(p, nines.data());
            first.mark_ready(p);
          }
          first.finish();
        }
        GradSync sync(pg, {{"a", {64}}, {"m", {64}}}, options);
        std::vector<float> ones(64, 1.0f);
        sync.add_grad(0, ones.data());
        sync.mark_ready(0);
        sync.mark_ready(1);
        sync.finish();
        for (std::size_t i = 0; i < 64; ++i) {
          EXPECT_FLOAT_EQ(sync.grad_view(0)[i], 1.0f) << "a[" << i << "]";
          EXPECT_EQ(sync.grad_view(1)[i], 0.0f) << "m[" << i << "]";
        }
      },
      shm_options(run));
}

TEST(GradSyncContribute, AnAccumulationWindowStoresFirstThenAddsAndTheNextWindowStoresAgain) {
  GradSyncOptions options;
  options.log_every = 0;
  on_ranks(2, [&](ProcessGroup& pg) {
    GradSync sync(pg, {{"w", {2, 3}}}, options);
    const float mine = pg.rank() == 0 ? 1.0f : 3.0f;
    for (int window = 0; window < 2; ++window) {
      std::vector<GradBlock> seen;
      {
        auto guard = sync.no_sync();
        sync.contribute(0, write_of(mine, &seen));
        sync.finish();
      }
      sync.contribute(0, write_of(mine, &seen));
      sync.finish();
      ASSERT_EQ(seen.size(), 2u);
      EXPECT_FALSE(seen[0].accumulate) << "window " << window;
      EXPECT_TRUE(seen[1].accumulate) << "window " << window;
      // Each rank: 2 x mine / 2; summed over ranks: 1 + 3.
      for (std::size_t i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(sync.grad_view(0)[i], 4.0f) << i;
    }
    std::vector<GradBlock> seen;
    sync.contribute(0, write_of(1.0f, &seen));
    EXPECT_TRUE(has(error_of([&] { sync.contribute(0, write_of(1.0f, &seen)); }),
                    "parameter 'w' (index 0) was already marked ready"));
    EXPECT_EQ(seen.size(), 1u) << "a refused hand-over writes nothing";
    sync.finish();
  });
}

}  // namespace
}  // namespace ddp::grad_sync_test
