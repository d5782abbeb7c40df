// The bucket layout GradSync uses, as a pure function: order, dtype/device
// grouping, the small first bucket, the cap crossed by one tensor, and the
// rebuild from an observed gradient order.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ddp/common/error.h"
#include "grad/grad_sync/bucket_packing.h"

namespace ddp {
namespace {

std::vector<std::size_t> params_of(const LayoutBucket& b) {
  std::vector<std::size_t> out;
  for (const auto& s : b.slots) out.push_back(s.param);
  return out;
}

std::vector<LayoutParam> floats(const std::vector<std::size_t>& counts) {
  std::vector<LayoutParam> out;
  for (auto c : counts) out.push_back({c, DType::kFloat32, -1});
  return out;
}

std::vector<std::size_t> all_reversed(std::size_t n) {
  return reverse_registration_order(std::vector<bool>(n, true));
}

TEST(BucketLayout, ParametersGoInReverseRegistrationOrderWithContiguousOffsets) {
  auto params = floats({10, 20, 30});
  auto layout = make_bucket_layout(params, all_reversed(3), 1 << 20, 1 << 20);
  ASSERT_EQ(layout.buckets.size(), 1u);
  EXPECT_EQ(params_of(layout.buckets[0]), (std::vector<std::size_t>{2, 1, 0}));
  EXPECT_EQ(layout.slot(2).offset, 0u);
  EXPECT_EQ(layout.slot(1).offset, 30u);
  EXPECT_EQ(layout.slot(0).offset, 50u);
  EXPECT_EQ(layout.buckets[0].count, 60u);
  EXPECT_EQ(layout.buckets[0].bytes(), 240u);
  EXPECT_EQ(layout.total_bytes(), 240u);
  EXPECT_EQ(layout.order, (std::vector<std::size_t>{2, 1, 0}));
}

TEST(BucketLayout, FirstBucketUsesFirstBucketBytesLaterOnesTheCap) {
  // 5 parameters of 100 B; first bucket 100 B (closes after one), cap 200 B (two each).
  auto params = floats({25, 25, 25, 25, 25});
  auto layout = make_bucket_layout(params, all_reversed(5), 100, 200);
  ASSERT_EQ(layout.buckets.size(), 3u);
  EXPECT_EQ(params_of(layout.buckets[0]), (std::vector<std::size_t>{4}));
  EXPECT_EQ(params_of(layout.buckets[1]), (std::vector<std::size_t>{3, 2}));
  EXPECT_EQ(params_of(layout.buckets[2]), (std::vector<std::size_t>{1, 0}));
}

TEST(BucketLayout, TheTensorThatCrossesTheCapStaysInTheBucket) {
  // Cap 100 B: 60 B + 60 B = 120 B closes the bucket (one tensor over the cap),
  // and a 400 B tensor alone is larger than any limit: a bucket of its own.
  auto params = floats({15, 15, 100, 5});  // 60 B, 60 B, 400 B, 20 B
  std::vector<std::size_t> order = {0, 1, 2, 3};
  auto layout = make_bucket_layout(params, order, 100, 100);
  ASSERT_EQ(layout.buckets.size(), 3u);
  EXPECT_EQ(params_of(layout.buckets[0]), (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(layout.buckets[0].bytes(), 120u);
  EXPECT_EQ(params_of(layout.buckets[1]), (std::vector<std::size_t>{2}));
  EXPECT_EQ(layout.buckets[1].bytes(), 400u);
  EXPECT_EQ(params_of(layout.buckets[2]), (std::vector<std::size_t>{3}));
}

TEST(BucketLayout, EachBucketHoldsOneDtypeAndDevice) {
  std::vector<LayoutParam> params = {{10, DType::kFloat32, -1}, {10, DType::kFloat64, -1},
                                     {10, DType::kFloat32, -1}, {10, DType::kFloat64, -1},
                                     {10, DType::kFloat16, -1}, {10, DType::kFloat32, 0}};
  auto layout = make_bucket_layout(params, all_reversed(6), 1 << 20, 1 << 20);
  ASSERT_EQ(layout.buckets.size(), 4u);
  // Numbered by their first parameter in the order 5, 4, 3, 2, 1, 0.
  EXPECT_EQ(layout.buckets[0].dtype, DType::kFloat32);
  EXPECT_EQ(layout.buckets[0].device, 0);
  EXPECT_EQ(params_of(layout.buckets[0]), (std::vector<std::size_t>{5}));
  EXPECT_EQ(layout.buckets[1].dtype, DType::kFloat16);
  EXPECT_EQ(layout.buckets[2].dtype, DType::kFloat64);
  EXPECT_EQ(params_of(layout.buckets[2]), (std::vector<std::size_t>{3, 1}));
  EXPECT_EQ(layout.buckets[3].dtype, DType::kFloat32);
  EXPECT_EQ(layout.buckets[3].device, -1);
  EXPECT_EQ(params_of(layout.buckets[3]), (std::vector<std::size_t>{2, 0}));
  for (std::size_t p = 0; p < params.size(); ++p) {
    const auto& b = layout.buckets[layout.bucket_of[p]];
    EXPECT_EQ(b.dtype, params[p].dtype) << p;
    EXPECT_EQ(b.device, params[p].device) << p;
  }
}

TEST(BucketLayout, EveryDtypeGroupStartsWithASmallFirstBucket) {
  // float32 and float64 interleaved: each group's first bucket closes at 8 B.
  std::vector<LayoutParam> params = {{2, DType::kFloat32, -1},
                                     {1, DType::kFloat64, -1},
                                     {2, DType::kFloat32, -1},
                                     {1, DType::kFloat64, -1}};
  auto layout = make_bucket_layout(params, {0, 1, 2, 3}, 8, 1 << 20);
  ASSERT_EQ(layout.buckets.size(), 4u);
  EXPECT_EQ(params_of(layout.buckets[0]), (std::vector<std::size_t>{0}));
  EXPECT_EQ(params_of(layout.buckets[1]), (std::vector<std::size_t>{1}));
  EXPECT_EQ(params_of(layout.buckets[2]), (std::vector<std::size_t>{2}));
  EXPECT_EQ(params_of(layout.buckets[3]), (std::vector<std::size_t>{3}));
}

TEST(BucketLayout, FrozenParametersGetNoSlot) {
  auto params = floats({4, 4, 4});
  auto order = reverse_registration_order({true, false, true});
  EXPECT_EQ(order, (std::vector<std::size_t>{2, 0}));
  auto layout = make_bucket_layout(params, order, 1 << 20, 1 << 20);
  EXPECT_EQ(layout.bucket_of[1], BucketLayout::kNone);
  EXPECT_EQ(layout.buckets[0].count, 8u);
}

TEST(BucketLayout, RebuildFollowsTheObservedOrderThenTheRest) {
  // Observed 0, 2 (1 and 3 never became ready): they follow in the old order.
  auto order = rebuild_order({0, 2}, {3, 2, 1, 0});
  EXPECT_EQ(order, (std::vector<std::size_t>{0, 2, 3, 1}));
  auto params = floats({25, 25, 25, 25});
  auto layout = make_bucket_layout(params, order, 100, 200);
  ASSERT_EQ(layout.buckets.size(), 3u);
  EXPECT_EQ(params_of(layout.buckets[0]), (std::vector<std::size_t>{0}));
  EXPECT_EQ(params_of(layout.buckets[1]), (std::vector<std::size_t>{2, 3}));
  EXPECT_EQ(params_of(layout.buckets[2]), (std::vector<std::size_t>{1}));
  // The same inputs always give the same layout (every rank computes it).
  EXPECT_EQ(layout, make_bucket_layout(params, order, 100, 200));
  EXPECT_NE(layout, make_bucket_layout(params, all_reversed(4), 100, 200));
}

TEST(BucketLayout, RebuildRejectsRepeatedUnknownOrFrozenIndices) {
  EXPECT_THROW(rebuild_order({1, 1}, {1, 0}), Error);
  EXPECT_THROW(rebuild_order({7}, {1, 0}), Error);
  try {
    rebuild_order({2}, {3, 1, 0});  // 2 is frozen: not in the fallback
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 2"), std::string::npos) << e.what();
  }
}

TEST(BucketLayout, BadOrdersAndLimitsAreRejected) {
  auto params = floats({1, 1});
  EXPECT_THROW(make_bucket_layout(params, {0, 0}, 8, 8), Error);
  EXPECT_THROW(make_bucket_layout(params, {2}, 8, 8), Error);
  EXPECT_THROW(make_bucket_layout(params, {0}, 0, 8), Error);
  EXPECT_THROW(make_bucket_layout(params, {0}, 8, 0), Error);
}

TEST(BucketLayout, EmptyModelHasNoBuckets) {
  auto layout = make_bucket_layout({}, {}, 8, 8);
  EXPECT_TRUE(layout.buckets.empty());
  EXPECT_EQ(describe_layout(layout), "0 buckets");
}

TEST(BucketLayout, DescriptionListsSizes) {
  auto layout = make_bucket_layout(floats({262144, 262144}), {1, 0}, 1 << 20, 1 << 20);
  EXPECT_EQ(describe_layout(layout), "2 buckets: 1.00 MiB (1 float32), 1.00 MiB (1 float32)");
}

}  // namespace
}  // namespace ddp
