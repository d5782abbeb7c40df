#pragma once
// Element-wise reductions for every (dtype, op), in Gloo's reduction-function
// shape: out[i] = a[i] op b[i]. kAvg reduces as kSum (divide afterwards with
// scale_for_average). Half and bfloat16 accumulate in float.

#include <cstddef>
#include <cstdint>

#include "ddp/types.h"

namespace ddp {

using ReduceFn = void (*)(void* out, const void* a, const void* b, std::size_t count);

ReduceFn reduce_function(DType dtype, ReduceOp op);
// a[i] = b[i] = a[i] op b[i], then divided by `divisor` when it is > 1 (kAvg;
// integer types truncate): the same bits as reduce_function then
// divide_in_place, written to both buffers in one pass (the in-place
// all-reduce of two ranks). a and b do not overlap. 16-bit types round the
// reduction, then the quotient, as the two-step path does.
using ReduceIntoBothFn = void (*)(void* a, void* b, std::size_t count, int divisor);
ReduceIntoBothFn reduce_into_both_function(DType dtype, ReduceOp op);

// data[i] /= divisor (integer types truncate).
void divide_in_place(void* data, std::size_t count, DType dtype, int divisor);

// ---- Gradient element loops (GradSync, SharedGradSum): floating dtypes only
// (float32, float64, float16, bfloat16); other dtypes are left untouched and
// load as 0. 16-bit values are computed in float and rounded to nearest even.

// One element at p as a double, and back.
double load_scalar(const void* p, DType dtype);
void store_scalar(void* p, DType dtype, double value);
// data[i] *= scale.
void scale_in_place(void* data, std::size_t count, DType dtype, double scale);
// dst[i] = src[i] * scale (accumulate false) or dst[i] += src[i] * scale.
void copy_scaled(void* dst, const void* src, std::size_t count, DType dtype, double scale,
                 bool accumulate);
// Compression: wire[i] = 16-bit(src[i] * scale), src float32 or float64;
// `half` picks IEEE half, else bfloat16. F16C where the CPU has it (the same
// results as types.h's scalar conversions), vectorised bfloat16 otherwise.
void compress_to_16(const void* src, DType dtype, std::uint16_t* wire, std::size_t count,
                    double scale, bool half);
// dst[i] = wire[i] widened to float32 or float64.
void decompress_from_16(const std::uint16_t* wire, void* dst, DType dtype, std::size_t count,
                        bool half);

}  // namespace ddp
