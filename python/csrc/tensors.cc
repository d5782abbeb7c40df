#include "tensors.h"

#include <c10/util/Exception.h>

#include "dtypes.h"

namespace ddprun_torch {

at::Tensor& single(const char* collective, std::vector<at::Tensor>& tensors) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "backend ddp: ", collective,
                    " takes exactly one tensor per rank; got ", tensors.size());
  check_movable(collective, tensors[0]);
  return tensors[0];
}

at::Tensor contiguous(const at::Tensor& tensor) { return tensor.contiguous(); }

void copy_back(at::Tensor& target, const at::Tensor& contiguous_copy) {
  if (!target.is_same(contiguous_copy)) target.copy_(contiguous_copy);
}

at::Tensor bytes_of(const at::Tensor& tensor) {
  return tensor.contiguous().reshape({-1}).view(at::kByte);
}

std::size_t nbytes(const at::Tensor& tensor) {
  return static_cast<std::size_t>(tensor.numel()) * tensor.element_size();
}

void check_like(const char* collective, const char* what, const std::vector<at::Tensor>& tensors,
                const at::Tensor& reference, std::size_t expected_count) {
  TORCH_CHECK_VALUE(tensors.size() == expected_count, "backend ddp: ", collective, " needs ",
                    expected_count, " ", what, " tensors; got ", tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    check_movable(collective, t);
    TORCH_CHECK_TYPE(t.scalar_type() == reference.scalar_type(), "backend ddp: ", collective, ": ",
                     what, " tensor ", i, " has dtype ", t.scalar_type(), ", the input ",
                     reference.scalar_type());
    TORCH_CHECK_VALUE(t.numel() == reference.numel(), "backend ddp: ", collective, ": ", what,
                      " tensor ", i, " has ", t.numel(), " elements, the input ",
                      reference.numel());
    TORCH_CHECK_VALUE(t.device() == reference.device(), "backend ddp: ", collective, ": ", what,
                      " tensor ", i, " is on ", t.device().str(), ", the input on ",
                      reference.device().str());
  }
}

}  // namespace ddprun_torch
