#pragma once
// Small checks and views the collectives share.

#include <ATen/ATen.h>

#include <cstddef>
#include <vector>

namespace ddprun_torch {

// The one tensor of a collective's list; throws c10::Error naming the
// collective when there are more or none (torch 2.x passes one per rank).
at::Tensor& single(const char* collective, std::vector<at::Tensor>& tensors);
// `tensor` itself when contiguous, else a contiguous copy (copied back by
// copy_back when it differs).
at::Tensor contiguous(const at::Tensor& tensor);
void copy_back(at::Tensor& target, const at::Tensor& contiguous_copy);
// The bytes of a contiguous tensor, flat (any dtype).
at::Tensor bytes_of(const at::Tensor& tensor);
std::size_t nbytes(const at::Tensor& tensor);
// Throws c10::Error naming the collective unless every tensor is on
// `reference`'s device and of its dtype and element count (`what` names
// the list: "output", ...).
void check_like(const char* collective, const char* what, const std::vector<at::Tensor>& tensors,
                const at::Tensor& reference, std::size_t expected_count);

}  // namespace ddprun_torch
