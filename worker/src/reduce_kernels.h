#pragma once
// Element-wise reductions for every (dtype, op), in Gloo's reduction-function
// shape: out[i] = a[i] op b[i]. kAvg reduces as kSum (divide afterwards with
// scale_for_average). Half and bfloat16 accumulate in float.

#include <cstddef>

#include "ddp/types.h"

namespace ddp {

using ReduceFn = void (*)(void* out, const void* a, const void* b, std::size_t count);

ReduceFn reduce_function(DType dtype, ReduceOp op);
// data[i] /= divisor (integer types truncate).
void divide_in_place(void* data, std::size_t count, DType dtype, int divisor);

}  // namespace ddp
