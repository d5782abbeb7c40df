#include "dtypes.h"

#include <c10/util/Exception.h>

namespace ddprun_torch {

std::optional<ddp::DType> native_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return ddp::DType::kFloat32;
    case at::kDouble:
      return ddp::DType::kFloat64;
    case at::kHalf:
      return ddp::DType::kFloat16;
    case at::kBFloat16:
      return ddp::DType::kBFloat16;
    case at::kInt:
      return ddp::DType::kInt32;
    case at::kLong:
      return ddp::DType::kInt64;
    case at::kByte:
      return ddp::DType::kUInt8;
    default:
      return std::nullopt;
  }
}

const char* op_label(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return "SUM";
    case c10d::ReduceOp::AVG:
      return "AVG";
    case c10d::ReduceOp::PRODUCT:
      return "PRODUCT";
    case c10d::ReduceOp::MIN:
      return "MIN";
    case c10d::ReduceOp::MAX:
      return "MAX";
    case c10d::ReduceOp::BAND:
      return "BAND";
    case c10d::ReduceOp::BOR:
      return "BOR";
    case c10d::ReduceOp::BXOR:
      return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return "UNUSED";
  }
}

std::optional<ddp::ReduceOp> native_op(const c10d::ReduceOp& op, at::ScalarType type) {
  if (!native_dtype(type)) return std::nullopt;
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return ddp::ReduceOp::kSum;
    case c10d::ReduceOp::AVG:
      return ddp::ReduceOp::kAvg;
    case c10d::ReduceOp::PRODUCT:
      return ddp::ReduceOp::kProduct;
    case c10d::ReduceOp::MIN:
      return ddp::ReduceOp::kMin;
    case c10d::ReduceOp::MAX:
      return ddp::ReduceOp::kMax;
    default:
      return std::nullopt;
  }
}

namespace {

bool movable_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kInt:
    case at::kLong:
    case at::kByte:
    case at::kChar:
    case at::kShort:
    case at::kBool:
    case at::kUInt16:
    case at::kUInt32:
    case at::kUInt64:
    case at::kComplexFloat:
    case at::kComplexDouble:
    case at::kComplexHalf:
    case at::kFloat8_e4m3fn:
    case at::kFloat8_e5m2:
      return true;
    default:
      return false;
  }
}

}  // namespace

void check_movable(const char* collective, const at::Tensor& tensor) {
  TORCH_CHECK_TYPE(tensor.layout() == at::kStrided, "backend ddp: ", collective,
                   " takes dense tensors; got a tensor of layout ", tensor.layout());
  TORCH_CHECK_TYPE(movable_type(tensor.scalar_type()), "backend ddp: ", collective,
                   " does not support dtype ", tensor.scalar_type());
}

void check_reducible(const char* collective, const c10d::ReduceOp& op, at::ScalarType type) {
  const auto kind = op.op_;
  TORCH_CHECK_VALUE(kind != c10d::ReduceOp::PREMUL_SUM && kind != c10d::ReduceOp::UNUSED,
                    "backend ddp: ", collective, " does not support ReduceOp.", op_label(op));
  const bool bitwise =
      kind == c10d::ReduceOp::BAND || kind == c10d::ReduceOp::BOR || kind == c10d::ReduceOp::BXOR;
  const bool integral = at::isIntegralType(type, /*includeBool=*/true);
  TORCH_CHECK_TYPE(!bitwise || integral, "backend ddp: ", collective, " with ReduceOp.",
                   op_label(op), " needs an integer or bool tensor; got dtype ", type);
  TORCH_CHECK_TYPE(!at::isComplexType(type), "backend ddp: ", collective, " with ReduceOp.",
                   op_label(op), " does not reduce complex dtype ", type,
                   " (torch.distributed passes complex SUM and AVG as real views)");
  TORCH_CHECK_TYPE(
      !at::isFloat8Type(type) && type != at::kUInt16 && type != at::kUInt32 && type != at::kUInt64,
      "backend ddp: ", collective, " does not reduce dtype ", type);
}

at::Tensor reduce_gathered(const at::Tensor& gathered, const c10d::ReduceOp& op) {
  const auto type = gathered.scalar_type();
  const bool is_bool = type == at::kBool;
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return is_bool ? gathered.any(0) : gathered.sum(0, false, type);
    case c10d::ReduceOp::AVG: {
      auto sum = gathered.sum(0, false, is_bool ? at::kLong : type);
      auto size = gathered.size(0);
      if (at::isFloatingType(type)) return sum.div_(size);
      return sum.div(size, "trunc").to(type);
    }
    case c10d::ReduceOp::PRODUCT:
      return is_bool ? gathered.all(0) : gathered.prod(0, false, type);
    case c10d::ReduceOp::MIN:
      return is_bool ? gathered.all(0) : std::get<0>(gathered.min(0));
    case c10d::ReduceOp::MAX:
      return is_bool ? gathered.any(0) : std::get<0>(gathered.max(0));
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR: {
      at::Tensor out = gathered[0].clone();
      for (int64_t r = 1; r < gathered.size(0); ++r) {
        if (op.op_ == c10d::ReduceOp::BAND) out.bitwise_and_(gathered[r]);
        if (op.op_ == c10d::ReduceOp::BOR) out.bitwise_or_(gathered[r]);
        if (op.op_ == c10d::ReduceOp::BXOR) out.bitwise_xor_(gathered[r]);
      }
      return out;
    }
    default:
      TORCH_CHECK(false, "backend ddp: ReduceOp.", op_label(op), " is not supported");
  }
}

}  // namespace ddprun_torch
