// GradSync's device buckets over NCCL (skipped without two GPUs, or one for
// the refusals) and the C API's every operation in a world of one.

#include "grad_sync_test_support.h"

namespace ddp {
namespace {

using namespace ::ddp::grad_sync_test;
using namespace std::chrono_literals;

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
