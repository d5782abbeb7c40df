#pragma once
// Element-wise reductions for every (dtype, op), in Gloo's reduction-function
// shape: out[i] = a[i] op b[i]. kAvg reduces as kSum (divide afterwards with
// scale_for_average). Half and bfloat16 accumulate in float.

#include <cstddef>

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

}  // namespace ddp
