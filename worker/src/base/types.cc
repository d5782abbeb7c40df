#include "ddp/types.h"

#include <bit>

namespace ddp {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kFloat16:
      return 2;
    case DType::kBFloat16:
      return 2;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kUInt8:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kUInt8:
      return "uint8";
  }
  return "unknown";
}

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kProduct:
      return "product";
  }
  return "unknown";
}

float half_to_float(std::uint16_t h) {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000) << 16;
  std::uint32_t exp = (h >> 10) & 0x1f;
  std::uint32_t mant = h & 0x3ff;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else {
    bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

std::uint16_t float_to_half(float f) {
  const auto x = std::bit_cast<std::uint32_t>(f);
  std::uint32_t sign = (x >> 16) & 0x8000;
  std::uint32_t exp = (x >> 23) & 0xff;
  std::uint32_t mant = x & 0x7fffff;
  if (exp == 0xff) return static_cast<std::uint16_t>(sign | 0x7c00 | (mant ? 0x200 : 0));
  int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<std::uint16_t>(sign | 0x7c00);  // overflow: inf
  if (e <= 0) {
    if (e < -10) return static_cast<std::uint16_t>(sign);  // underflow: zero
    mant |= 0x800000;
    int shift = 14 - e;
    std::uint32_t half_mant = mant >> shift;
    std::uint32_t rest = mant & ((1u << shift) - 1);
    std::uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half_mant & 1))) ++half_mant;
    return static_cast<std::uint16_t>(sign | half_mant);
  }
  std::uint32_t half = sign | (static_cast<std::uint32_t>(e) << 10) | (mant >> 13);
  std::uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1)))
    ++half;  // may carry into the exponent: correct
  return static_cast<std::uint16_t>(half);
}

}  // namespace ddp
