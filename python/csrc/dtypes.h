#pragma once
// How torch's element types and reduce ops map onto libddp's, and the
// reduction done here for the pairs libddp's kernels do not cover (int8,
// bool, int16, bitwise ops): every rank's input is gathered, then reduced
// with torch's own operators, so the result is what torch computes.

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <optional>

#include "ddp/types.h"

namespace ddprun_torch {

// libddp's element type for `type`; nullopt when it has none.
std::optional<ddp::DType> native_dtype(at::ScalarType type);
// libddp's reduce op for `op` on `type`; nullopt when libddp cannot reduce
// that pair (the gathered path then does).
std::optional<ddp::ReduceOp> native_op(const c10d::ReduceOp& op, at::ScalarType type);

// Throws c10::Error naming `collective`, the op and the dtype when torch's
// Gloo would refuse the pair too (PREMUL_SUM, bitwise ops on floating types,
// an unknown op) or the dtype is not one this backend moves.
void check_reducible(const char* collective, const c10d::ReduceOp& op, at::ScalarType type);
// Throws c10::Error naming `collective` and the dtype when the backend
// cannot move tensors of `type` (sparse, quantized and the like).
void check_movable(const char* collective, const at::Tensor& tensor);

// The reduction of `gathered` ([ranks, ...]) over its first dimension, with
// `op`, in `gathered`'s dtype (integer sums wrap as the dtype does).
at::Tensor reduce_gathered(const at::Tensor& gathered, const c10d::ReduceOp& op);

const char* op_label(const c10d::ReduceOp& op);

}  // namespace ddprun_torch
