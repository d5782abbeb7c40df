#pragma once
// Element types and reduction operations of libddp's collectives.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ddp {

enum class DType : int { kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8 };
enum class ReduceOp : int { kSum, kAvg, kMin, kMax, kProduct };

// Elements [begin, end) of a buffer or of one parameter.
struct ElementRange {
  std::size_t begin = 0;
  std::size_t end = 0;
  std::size_t size() const { return end - begin; }
  bool empty() const { return begin == end; }
};

// Bytes per element.
std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "float32", ...
const char* op_name(ReduceOp op);     // "sum", ...

// IEEE half and bfloat16 conversions (round to nearest even), for reductions
// and compression.
float half_to_float(std::uint16_t h);
std::uint16_t float_to_half(float f);
// Inline, branch-free bit arithmetic (NaN stays NaN), so loops over them
// vectorise: out of line they cost ~20x in the bf16 reduction kernels.
inline float bfloat16_to_float(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}
inline std::uint16_t float_to_bfloat16(float f) {
  const auto x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (x >> 16) | 0x40u;
  return static_cast<std::uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

}  // namespace ddp
