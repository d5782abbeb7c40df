// The reduction kernels Gloo calls: the vectorised half-precision path gives
// exactly what converting each element to float, reducing and rounding back
// (to nearest even) gives, for every op, including the scalar tail.

#include "reduce_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace ddp {
namespace {

float reference(ReduceOp op, float a, float b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return a + b;
    case ReduceOp::kProduct: return a * b;
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
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
        do { a[i] = static_cast<std::uint16_t>(bits(rng)); } while ((a[i] & 0x7c00) == 0x7c00);
        do { b[i] = static_cast<std::uint16_t>(bits(rng)); } while ((b[i] & 0x7c00) == 0x7c00);
      }
      reduce_function(DType::kFloat16, op)(out.data(), a.data(), b.data(), n);
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t expected = float_to_half(reference(op, half_to_float(a[i]), half_to_float(b[i])));
        ASSERT_EQ(out[i], expected) << op_name(op) << " n=" << n << " i=" << i << " a=" << a[i] << " b=" << b[i];
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

}  // namespace
}  // namespace ddp
