// The reduction kernels Gloo and shm call: the vectorised half-precision and
// bfloat16 paths give exactly what converting each element to float, reducing
// and rounding back (to nearest even) gives, for every op, including the
// scalar tail; the two-rank "into both" kernels give exactly what the plain
// kernel followed by divide_in_place gives.

#include "kernels/reduce_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace ddp {
namespace {

float reference(ReduceOp op, float a, float b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return a + b;
    case ReduceOp::kProduct:
      return a * b;
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
  }
  return 0;
}

TEST(ReduceKernels, HalfPrecisionMatchesElementwiseFloatReference) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> bits(0, 0xffff);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
    for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 1000u, 4099u}) {
      std::vector<std::uint16_t> a(n), b(n), out(n);
      for (std::size_t i = 0; i < n; ++i) {
        // Finite values only: NaN payloads may differ between conversion paths.
        do {
          a[i] = static_cast<std::uint16_t>(bits(rng));
        } while ((a[i] & 0x7c00) == 0x7c00);
        do {
          b[i] = static_cast<std::uint16_t>(bits(rng));
        } while ((b[i] & 0x7c00) == 0x7c00);
      }
      reduce_function(DType::kFloat16, op)(out.data(), a.data(), b.data(), n);
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t expected =
            float_to_half(reference(op, half_to_float(a[i]), half_to_float(b[i])));
        ASSERT_EQ(out[i], expected)
            << op_name(op) << " n=" << n << " i=" << i << " a=" << a[i] << " b=" << b[i];
      }
    }
  }
}

// types.h's bfloat16 conversions, against the bit patterns they must give:
// truncation below half an ulp, ties to even, carries into the exponent and
// to infinity, infinities kept, NaNs kept NaN (quiet), and exact widening.
TEST(BFloat16, ConversionsRoundToNearestEvenAndKeepInfinitiesAndNaNs) {
  auto f = [](std::uint32_t bits) { return std::bit_cast<float>(bits); };
  EXPECT_EQ(float_to_bfloat16(f(0x3f800000u)), 0x3f80);  // 1.0
  EXPECT_EQ(float_to_bfloat16(f(0x3f807fffu)), 0x3f80);  // below half: down
  EXPECT_EQ(float_to_bfloat16(f(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(float_to_bfloat16(f(0x3f818000u)), 0x3f82);  // tie, odd rounds up to even
  EXPECT_EQ(float_to_bfloat16(f(0x3f808001u)), 0x3f81);  // above half: up
  EXPECT_EQ(float_to_bfloat16(f(0x3fffffffu)), 0x4000);  // carries into the exponent
  EXPECT_EQ(float_to_bfloat16(f(0x7f7fffffu)), 0x7f80);  // largest float: to infinity
  EXPECT_EQ(float_to_bfloat16(f(0xff800000u)), 0xff80);  // -infinity
  EXPECT_EQ(float_to_bfloat16(f(0x80000001u)), 0x8000);  // tiny negative subnormal: -0
  EXPECT_EQ(float_to_bfloat16(f(0x7f800001u)), 0x7fc0);  // signalling NaN: quiet NaN, not infinity
  EXPECT_EQ(float_to_bfloat16(f(0xffffffffu)), 0xffff);  // NaN with all payload bits stays
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(bfloat16_to_float(h)), b << 16) << b;  // exact widening
    if ((b & 0x7f80) != 0x7f80 || (b & 0x7f) == 0) {  // every non-NaN pattern comes back unchanged
      ASSERT_EQ(float_to_bfloat16(bfloat16_to_float(h)), h) << b;
    }
  }
}

// The vectorised bfloat16 loop gives what the scalar helpers of types.h give,
// element by element, for every bit pattern class: normals, subnormals,
// infinities, NaNs, and values that round up into the next exponent.
TEST(ReduceKernels, BFloat16MatchesElementwiseFloatReference) {
  std::mt19937 rng(13);
  std::uniform_int_distribution<int> bits(0, 0xffff);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
    for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 17u, 1000u, 4099u}) {
      std::vector<std::uint16_t> a(n), b(n), out(n);
      for (std::size_t i = 0; i < n; ++i) {
        a[i] = static_cast<std::uint16_t>(bits(rng));
        b[i] = static_cast<std::uint16_t>(bits(rng));
      }
      reduce_function(DType::kBFloat16, op)(out.data(), a.data(), b.data(), n);
      for (std::size_t i = 0; i < n; ++i) {
        const float r = reference(op, bfloat16_to_float(a[i]), bfloat16_to_float(b[i]));
        if (std::isnan(r)) {
          ASSERT_TRUE(std::isnan(bfloat16_to_float(out[i])))
              << op_name(op) << " n=" << n << " i=" << i;
          continue;
        }
        ASSERT_EQ(out[i], float_to_bfloat16(r))
            << op_name(op) << " n=" << n << " i=" << i << " a=" << a[i] << " b=" << b[i];
      }
    }
  }
}

TEST(ReduceKernels, BFloat16AndIntegersReduceElementwise) {
  std::vector<std::uint16_t> a = {float_to_bfloat16(1.5f), float_to_bfloat16(-2.0f)};
  std::vector<std::uint16_t> b = {float_to_bfloat16(2.5f), float_to_bfloat16(3.0f)};
  std::vector<std::uint16_t> out(2);
  reduce_function(DType::kBFloat16, ReduceOp::kSum)(out.data(), a.data(), b.data(), 2);
  EXPECT_EQ(bfloat16_to_float(out[0]), 4.0f);
  EXPECT_EQ(bfloat16_to_float(out[1]), 1.0f);
  std::vector<std::int64_t> x = {5, -7}, y = {3, 2}, z(2);
  reduce_function(DType::kInt64, ReduceOp::kMin)(z.data(), x.data(), y.data(), 2);
  EXPECT_EQ(z, (std::vector<std::int64_t>{3, -7}));
}

// The two-rank in-place kernel stores exactly what reduce_function followed by
// divide_in_place gives (what every other path computes), into both buffers.
template <class T>
void expect_into_both_matches(DType dtype, std::mt19937& rng) {
  std::uniform_int_distribution<int> values(-100, 100);
  for (ReduceOp op :
       {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
    for (int divisor : {1, 2, 3}) {
      if (op != ReduceOp::kAvg && divisor != 1) continue;
      for (std::size_t n : {0u, 1u, 7u, 33u, 1000u, 4099u}) {
        std::vector<T> a(n), b(n), expected(n);
        for (std::size_t i = 0; i < n; ++i) {
          a[i] = static_cast<T>(values(rng)) / static_cast<T>(std::is_floating_point_v<T> ? 7 : 1);
          b[i] = static_cast<T>(values(rng)) / static_cast<T>(std::is_floating_point_v<T> ? 3 : 1);
        }
        reduce_function(dtype, op)(expected.data(), a.data(), b.data(), n);
        if (op == ReduceOp::kAvg) divide_in_place(expected.data(), n, dtype, divisor);
        auto both = reduce_into_both_function(dtype, op);
        ASSERT_NE(both, nullptr);
        both(a.data(), b.data(), n, op == ReduceOp::kAvg ? divisor : 1);
        SCOPED_TRACE("dtype " + std::string(dtype_name(dtype)) + " op " + op_name(op) + " n " +
                     std::to_string(n));
        for (std::size_t i = 0; i < n; ++i) {
          ASSERT_EQ(std::memcmp(&a[i], &expected[i], sizeof(T)), 0) << "element " << i;
          ASSERT_EQ(std::memcmp(&b[i], &expected[i], sizeof(T)), 0) << "element " << i;
        }
      }
    }
  }
}

TEST(ReduceKernels, IntoBothStoresTheReductionIntoBothBuffersBitForBit) {
  std::mt19937 rng(11);
  expect_into_both_matches<float>(DType::kFloat32, rng);
  expect_into_both_matches<double>(DType::kFloat64, rng);
  expect_into_both_matches<std::int32_t>(DType::kInt32, rng);
  expect_into_both_matches<std::int64_t>(DType::kInt64, rng);
  expect_into_both_matches<std::uint8_t>(DType::kUInt8, rng);
}

// 16-bit types: random finite bit patterns (and +-0, which min/max keep), the
// same check bit for bit, including the double rounding of kAvg (rounded sum,
// then the rounded quotient) that reduce_function + divide_in_place give.
void expect_sixteen_into_both_matches(DType dtype, std::uint16_t exponent_mask, std::mt19937& rng) {
  std::uniform_int_distribution<int> bits(0, 0xffff);
  for (ReduceOp op :
       {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
    for (int divisor : {1, 2, 3}) {
      if (op != ReduceOp::kAvg && divisor != 1) continue;
      for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 33u, 1000u, 4099u}) {
        std::vector<std::uint16_t> a(n), b(n), expected(n);
        for (std::size_t i = 0; i < n; ++i) {
          do {
            a[i] = static_cast<std::uint16_t>(bits(rng));
          } while ((a[i] & exponent_mask) == exponent_mask);
          do {
            b[i] = static_cast<std::uint16_t>(bits(rng));
          } while ((b[i] & exponent_mask) == exponent_mask);
        }
        reduce_function(dtype, op)(expected.data(), a.data(), b.data(), n);
        if (op == ReduceOp::kAvg) divide_in_place(expected.data(), n, dtype, divisor);
        auto both = reduce_into_both_function(dtype, op);
        ASSERT_NE(both, nullptr);
        both(a.data(), b.data(), n, op == ReduceOp::kAvg ? divisor : 1);
        SCOPED_TRACE("dtype " + std::string(dtype_name(dtype)) + " op " + op_name(op) + " n " +
                     std::to_string(n) + " divisor " + std::to_string(divisor));
        for (std::size_t i = 0; i < n; ++i) {
          // A finite sum may overflow to infinity; never to NaN for + and *,
          // but inf - inf cannot occur with finite inputs, so bits compare.
          ASSERT_EQ(a[i], expected[i]) << "element " << i;
          ASSERT_EQ(b[i], expected[i]) << "element " << i;
        }
      }
    }
  }
}

TEST(ReduceKernels, IntoBothForSixteenBitTypesMatchesReduceThenDivide) {
  std::mt19937 rng(17);
  expect_sixteen_into_both_matches(DType::kFloat16, 0x7c00, rng);
  expect_sixteen_into_both_matches(DType::kBFloat16, 0x7f80, rng);
}

}  // namespace
}  // namespace ddp
