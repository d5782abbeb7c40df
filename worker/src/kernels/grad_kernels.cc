// The gradient element loops of reduce_kernels.h (GradSync, SharedGradSum):
// scalar access, scaling, scaled copies, and the 16-bit wire format of
// compressed gradients.

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/cpu_features.h"
#include "kernels/reduce_kernels.h"

namespace ddp {
namespace {

// Whole buffers float32 <-> 16-bit for compression (the scalar conversions of
// types.h are exact but one call per element): F16C for half, with the same
// round-to-nearest-even results.
#if defined(__x86_64__)
__attribute__((target("avx,f16c"))) void floats_to_half_f16c(const float* s, float k,
                                                             std::uint16_t* out, std::size_t n) {
  const __m256 scale = _mm256_set1_ps(k);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s + i), scale);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) out[i] = float_to_half(s[i] * k);
}

__attribute__((target("avx,f16c"))) void half_to_floats_f16c(const std::uint16_t* in, float* d,
                                                             std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) d[i] = half_to_float(in[i]);
}
#endif

void floats_to_half(const float* s, float k, std::uint16_t* out, std::size_t n) {
#if defined(__x86_64__)
  if (cpu::has_f16c()) return floats_to_half_f16c(s, k, out, n);
#endif
  for (std::size_t i = 0; i < n; ++i) out[i] = float_to_half(s[i] * k);
}

void half_to_floats(const std::uint16_t* in, float* d, std::size_t n) {
#if defined(__x86_64__)
  if (cpu::has_f16c()) return half_to_floats_f16c(in, d, n);
#endif
  for (std::size_t i = 0; i < n; ++i) d[i] = half_to_float(in[i]);
}

// types.h's inline bfloat16 conversions: these loops vectorise.
void floats_to_bfloat16(const float* s, float k, std::uint16_t* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = float_to_bfloat16(s[i] * k);
}

void bfloat16_to_floats(const std::uint16_t* in, float* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = bfloat16_to_float(in[i]);
}

// 16-bit floats as float and back.
float from16(std::uint16_t v, bool half) { return half ? half_to_float(v) : bfloat16_to_float(v); }
std::uint16_t to16(float v, bool half) { return half ? float_to_half(v) : float_to_bfloat16(v); }

}  // namespace

double load_scalar(const void* p, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: {
      float v;
      std::memcpy(&v, p, sizeof v);
      return v;
    }
    case DType::kFloat64: {
      double v;
      std::memcpy(&v, p, sizeof v);
      return v;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      std::uint16_t v;
      std::memcpy(&v, p, sizeof v);
      return from16(v, dtype == DType::kFloat16);
    }
    default:
      return 0;
  }
}

void store_scalar(void* p, DType dtype, double value) {
  switch (dtype) {
    case DType::kFloat32: {
      float v = static_cast<float>(value);
      std::memcpy(p, &v, sizeof v);
      break;
    }
    case DType::kFloat64:
      std::memcpy(p, &value, sizeof value);
      break;
    case DType::kFloat16:
    case DType::kBFloat16: {
      std::uint16_t v = to16(static_cast<float>(value), dtype == DType::kFloat16);
      std::memcpy(p, &v, sizeof v);
      break;
    }
    default:
      break;
  }
}

void scale_in_place(void* data, std::size_t count, DType dtype, double scale) {
  switch (dtype) {
    case DType::kFloat32: {
      float* x = static_cast<float*>(data);
      const float s = static_cast<float>(scale);
      for (std::size_t i = 0; i < count; ++i) x[i] *= s;
      break;
    }
    case DType::kFloat64: {
      double* x = static_cast<double*>(data);
      for (std::size_t i = 0; i < count; ++i) x[i] *= scale;
      break;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      const bool half = dtype == DType::kFloat16;
      std::uint16_t* x = static_cast<std::uint16_t*>(data);
      const float s = static_cast<float>(scale);
      for (std::size_t i = 0; i < count; ++i) x[i] = to16(from16(x[i], half) * s, half);
      break;
    }
    default:
      break;
  }
}

void copy_scaled(void* dst, const void* src, std::size_t count, DType dtype, double scale,
                 bool accumulate) {
  switch (dtype) {
    case DType::kFloat32: {
      float* d = static_cast<float*>(dst);
      const float* s = static_cast<const float*>(src);
      const float k = static_cast<float>(scale);
      if (accumulate) {
        for (std::size_t i = 0; i < count; ++i) d[i] += s[i] * k;
      } else {
        for (std::size_t i = 0; i < count; ++i) d[i] = s[i] * k;
      }
      break;
    }
    case DType::kFloat64: {
      double* d = static_cast<double*>(dst);
      const double* s = static_cast<const double*>(src);
      if (accumulate) {
        for (std::size_t i = 0; i < count; ++i) d[i] += s[i] * scale;
      } else {
        for (std::size_t i = 0; i < count; ++i) d[i] = s[i] * scale;
      }
      break;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      const bool half = dtype == DType::kFloat16;
      std::uint16_t* d = static_cast<std::uint16_t*>(dst);
      const std::uint16_t* s = static_cast<const std::uint16_t*>(src);
      const float k = static_cast<float>(scale);
      for (std::size_t i = 0; i < count; ++i) {
        float v = from16(s[i], half) * k;
        d[i] = to16(accumulate ? from16(d[i], half) + v : v, half);
      }
      break;
    }
    default:
      break;
  }
}

void compress_to_16(const void* src, DType dtype, std::uint16_t* wire, std::size_t count,
                    double scale, bool half) {
  if (dtype == DType::kFloat32) {
    const float* s = static_cast<const float*>(src);
    const float k = static_cast<float>(scale);
    if (half) {
      floats_to_half(s, k, wire, count);
    } else {
      floats_to_bfloat16(s, k, wire, count);
    }
  } else {
    const double* s = static_cast<const double*>(src);
    for (std::size_t i = 0; i < count; ++i) wire[i] = to16(static_cast<float>(s[i] * scale), half);
  }
}

void decompress_from_16(const std::uint16_t* wire, void* dst, DType dtype, std::size_t count,
                        bool half) {
  if (dtype == DType::kFloat32) {
    float* d = static_cast<float*>(dst);
    if (half) {
      half_to_floats(wire, d, count);
    } else {
      bfloat16_to_floats(wire, d, count);
    }
  } else {
    double* d = static_cast<double*>(dst);
    for (std::size_t i = 0; i < count; ++i) d[i] = from16(wire[i], half);
  }
}

}  // namespace ddp
