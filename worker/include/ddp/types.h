#pragma once
// Element types and reduction operations of libddp's collectives.

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
const char* dtype_name(DType dtype);   // "float32", ...
const char* op_name(ReduceOp op);      // "sum", ...

// IEEE half and bfloat16 conversions (round to nearest even), for reductions
// and compression.
float half_to_float(std::uint16_t h);
std::uint16_t float_to_half(float f);
float bfloat16_to_float(std::uint16_t b);
std::uint16_t float_to_bfloat16(float f);

}  // namespace ddp
