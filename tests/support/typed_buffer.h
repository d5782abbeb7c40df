#pragma once
// Test support for collectives: buffers of any dtype read and written as
// doubles, inputs that stay exact in every dtype, and the locally computed
// reference each rank checks its results against. Shared by the thread-rank
// tests and the collective_worker tool run under ddprun. Header-only.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ddp/types.h"

namespace ddp::testing {

inline constexpr DType kDTypes[] = {DType::kFloat32,  DType::kFloat64, DType::kFloat16,
                                    DType::kBFloat16, DType::kInt32,   DType::kInt64,
                                    DType::kUInt8};
inline constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                                    ReduceOp::kProduct};
// 0 and 1, odd sizes that no world divides, and one that spans many Gloo segments.
inline constexpr std::size_t kCounts[] = {0, 1, 7, 1001};

inline bool is_float(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kFloat16 ||
         d == DType::kBFloat16;
}
inline bool is_signed(DType d) { return d != DType::kUInt8; }

// Element `i` of rank `r`'s input: small integers, exact in every dtype, whose
// sums, products, minima and maxima over 4 ranks stay exact too (|x| <= 81).
// Signed types include negatives so min/max and truncating averages are tested.
inline double input_value(int r, std::size_t i, DType dtype) {
  static const double kSigned[] = {-2, -1, 1, 2, 3};
  if (is_signed(dtype)) return kSigned[(static_cast<std::size_t>(r) * 2 + i) % 5];
  return 1 + static_cast<double>((static_cast<std::size_t>(r) + i) % 3);
}

// Element `k` of rank `r`'s data for collectives that only move data: distinct
// for nearby ranks and positions (so a misplaced slice shows), exact in every dtype.
inline double moved_value(int r, std::size_t k, DType dtype) {
  double v = static_cast<double>((static_cast<std::size_t>(r) * 37 + k * 3) % 251);
  return is_signed(dtype) ? v - 100 : v;
}

// op over the world's values (value(r) for rank r); averages of integer types
// truncate toward zero. Callables are template parameters here and below: the
// checks call them once per element, too often for std::function's heap copy.
template <class Value>
double reference(ReduceOp op, DType dtype, int world, Value&& value) {
  double sum = 0, product = 1, lo = value(0), hi = value(0);
  for (int r = 0; r < world; ++r) {
    double v = value(r);
    sum += v;
    product *= v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  switch (op) {
    case ReduceOp::kSum:
      return sum;
    case ReduceOp::kAvg:
      return is_float(dtype) ? sum / world : std::trunc(sum / world);
    case ReduceOp::kMin:
      return lo;
    case ReduceOp::kMax:
      return hi;
    case ReduceOp::kProduct:
      return product;
  }
  return 0;
}

// Integer-valued results are exact; a float average may be off by its rounding.
inline double tolerance(DType dtype, double expected) {
  switch (dtype) {
    case DType::kFloat16:
      return std::abs(expected) / 1024;
    case DType::kBFloat16:
      return std::abs(expected) / 128;
    case DType::kFloat32:
      return std::abs(expected) * 1e-6;
    case DType::kFloat64:
      return std::abs(expected) * 1e-14;
    default:
      return 0;
  }
}

// A buffer of any dtype, written and read as doubles.
class Buffer {
 public:
  Buffer(DType dtype, std::size_t count)
      : dtype_(dtype), count_(count), bytes_(std::max<std::size_t>(count * dtype_size(dtype), 1)) {}
  void* data() { return bytes_.data(); }
  std::size_t count() const { return count_; }
  DType dtype() const { return dtype_; }
  char* slice(std::size_t first) {
    return reinterpret_cast<char*>(bytes_.data()) + first * dtype_size(dtype_);
  }

  void set(std::size_t i, double v) {
    void* p = bytes_.data() + i * dtype_size(dtype_);
    switch (dtype_) {
      case DType::kFloat32:
        store(p, static_cast<float>(v));
        break;
      case DType::kFloat64:
        store(p, v);
        break;
      case DType::kFloat16:
        store(p, float_to_half(static_cast<float>(v)));
        break;
      case DType::kBFloat16:
        store(p, float_to_bfloat16(static_cast<float>(v)));
        break;
      case DType::kInt32:
        store(p, static_cast<std::int32_t>(v));
        break;
      case DType::kInt64:
        store(p, static_cast<std::int64_t>(v));
        break;
      case DType::kUInt8:
        store(p, static_cast<std::uint8_t>(v));
        break;
    }
  }
  double get(std::size_t i) const {
    const void* p = bytes_.data() + i * dtype_size(dtype_);
    switch (dtype_) {
      case DType::kFloat32:
        return load<float>(p);
      case DType::kFloat64:
        return load<double>(p);
      case DType::kFloat16:
        return half_to_float(load<std::uint16_t>(p));
      case DType::kBFloat16:
        return bfloat16_to_float(load<std::uint16_t>(p));
      case DType::kInt32:
        return load<std::int32_t>(p);
      case DType::kInt64:
        return static_cast<double>(load<std::int64_t>(p));
      case DType::kUInt8:
        return load<std::uint8_t>(p);
    }
    return 0;
  }
  // Fills elements [first, first + n) with f(j), j counting from 0.
  template <class F>
  void fill(std::size_t first, std::size_t n, F&& f) {
    for (std::size_t j = 0; j < n; ++j) set(first + j, f(j));
  }
  // "" when elements [first, first + n) equal expected(j); else a message
  // naming `what`, the dtype and the first element that differs.
  template <class Expected>
  std::string mismatch(std::size_t first, std::size_t n, Expected&& expected,
                       const std::string& what) const {
    for (std::size_t j = 0; j < n; ++j) {
      double want = expected(j), have = get(first + j);
      if (std::abs(have - want) > tolerance(dtype_, want)) {
        return what + " (" + dtype_name(dtype_) + "): element " + std::to_string(j) + " is " +
               std::to_string(have) + ", expected " + std::to_string(want);
      }
    }
    return "";
  }

 private:
  template <class T>
  static void store(void* p, T v) {
    std::memcpy(p, &v, sizeof v);
  }
  template <class T>
  static T load(const void* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  DType dtype_;
  std::size_t count_;
  std::vector<unsigned char> bytes_;
};

}  // namespace ddp::testing
