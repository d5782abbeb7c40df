// all_to_all in its two forms. Even splits go to libddp's all_to_all as
// they are; uneven ones are padded to the largest split any rank sends
// (agreed with one all_reduce of the maximum first) and unpadded after.
#include <c10/util/Exception.h>

#include <algorithm>
#include <numeric>

#include "backend.h"
#include "dtypes.h"
#include "tensors.h"

namespace ddprun_torch {
namespace {

constexpr auto kBytes = ddp::DType::kUInt8;

// Split sizes (in rows of `rows` total) as byte offsets and lengths.
std::vector<int64_t> split_bytes(const std::vector<int64_t>& splits, int64_t row_bytes) {
  std::vector<int64_t> out;
  for (auto s : splits) out.push_back(s * row_bytes);
  return out;
}

void check_splits(const char* what, const std::vector<int64_t>& splits, int64_t rows, int size) {
  TORCH_CHECK_VALUE(static_cast<int>(splits.size()) == size,
                    "backend ddp: all_to_all_single: ", what, " split sizes list ", splits.size(),
                    " entries for a group of ", size);
  const int64_t total = std::accumulate(splits.begin(), splits.end(), int64_t{0});
  TORCH_CHECK_VALUE(
      total == rows && std::all_of(splits.begin(), splits.end(), [](int64_t s) { return s >= 0; }),
      "backend ddp: all_to_all_single: ", what, " split sizes add up to ", total,
      ", the tensor's first dimension is ", rows);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> DdpBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                         std::vector<int64_t>& output_splits,
                                                         std::vector<int64_t>& input_splits,
                                                         const c10d::AllToAllOptions& opts) {
  const char* title = "all_to_all_single";
  check_movable(title, input);
  check_movable(title, output);
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "backend ddp: ", title,
                   ": output dtype ", output.scalar_type(), " differs from the input's ",
                   input.scalar_type());
  if (!output_splits.empty() || !input_splits.empty()) {
    return all_to_all_uneven(output, input, output_splits, input_splits, opts.asyncOp);
  }
  TORCH_CHECK_VALUE(input.numel() == output.numel() && input.numel() % size_ == 0,
                    "backend ddp: ", title,
                    ": input and output need the same number of elements, "
                    "a multiple of the group's ",
                    size_, "; got ", input.numel(), " and ", output.numel());
  at::Tensor in = bytes_of(input);
  at::Tensor out_c = contiguous(output);
  at::Tensor out = bytes_of(out_c);
  at::Tensor target = output;
  const std::size_t each = nbytes(in) / size_;
  Issue issue = [in, out, each](ddp::ProcessGroup& g, bool queued) -> std::shared_ptr<ddp::Work> {
    if (each == 0) return nullptr;
    if (queued) return g.all_to_all_async(in.data_ptr(), out.data_ptr(), each, kBytes);
    g.all_to_all(in.data_ptr(), out.data_ptr(), each, kBytes);
    return nullptr;
  };
  return run(c10d::OpType::ALLTOALL_BASE, title, opts.asyncOp, input.device(), {target}, issue,
             [target, out_c]() mutable { copy_back(target, out_c); });
}

c10::intrusive_ptr<c10d::Work> DdpBackend::all_to_all_uneven(at::Tensor output, at::Tensor input,
                                                             std::vector<int64_t> output_splits,
                                                             std::vector<int64_t> input_splits,
                                                             bool async) {
  const int64_t in_rows = input.dim() == 0 ? 1 : input.size(0);
  const int64_t out_rows = output.dim() == 0 ? 1 : output.size(0);
  if (input_splits.empty()) input_splits.assign(size_, in_rows / size_);
  if (output_splits.empty()) output_splits.assign(size_, out_rows / size_);
  check_splits("input", input_splits, in_rows, size_);
  check_splits("output", output_splits, out_rows, size_);
  const int64_t row_bytes = in_rows == 0 ? 0 : static_cast<int64_t>(nbytes(input)) / in_rows;
  const auto in_bytes = split_bytes(input_splits, row_bytes);
  const auto out_bytes = split_bytes(output_splits, row_bytes);
  // The slot every rank pads its pieces to: the largest piece anyone sends.
  int64_t slot = std::max(*std::max_element(in_bytes.begin(), in_bytes.end()),
                          *std::max_element(out_bytes.begin(), out_bytes.end()));
  cpu_->all_reduce(&slot, 1, ddp::DType::kInt64, ddp::ReduceOp::kMax);
  at::Tensor in = bytes_of(input);
  at::Tensor padded_in = at::zeros({slot * size_}, in.options());
  int64_t from = 0;
  for (int r = 0; r < size_; ++r) {
    padded_in.narrow(0, r * slot, in_bytes[r]).copy_(in.narrow(0, from, in_bytes[r]));
    from += in_bytes[r];
  }
  at::Tensor padded_out = at::empty({slot * size_}, in.options());
  at::Tensor target = output;
  const auto each = static_cast<std::size_t>(slot);
  Issue issue = [padded_in, padded_out, each](ddp::ProcessGroup& g,
                                              bool queued) -> std::shared_ptr<ddp::Work> {
    if (each == 0) return nullptr;
    if (queued)
      return g.all_to_all_async(padded_in.data_ptr(), padded_out.data_ptr(), each, kBytes);
    g.all_to_all(padded_in.data_ptr(), padded_out.data_ptr(), each, kBytes);
    return nullptr;
  };
  auto unpad = [target, padded_out, out_bytes, slot, size = size_]() mutable {
    at::Tensor out = at::empty({static_cast<int64_t>(nbytes(target))}, padded_out.options());
    int64_t to = 0;
    for (int r = 0; r < size; ++r) {
      out.narrow(0, to, out_bytes[r]).copy_(padded_out.narrow(0, r * slot, out_bytes[r]));
      to += out_bytes[r];
    }
    target.copy_(out.view(target.scalar_type()).view(target.sizes()));
  };
  return run(c10d::OpType::ALLTOALL_BASE, "all_to_all_single", async, input.device(), {target},
             issue, unpad);
}

c10::intrusive_ptr<c10d::Work> DdpBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                    std::vector<at::Tensor>& inputs,
                                                    const c10d::AllToAllOptions& opts) {
  const char* title = "all_to_all";
  TORCH_CHECK_VALUE(
      static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_,
      "backend ddp: ", title, " needs one input and one output tensor per rank (", size_, "); got ",
      inputs.size(), " and ", outputs.size());
  // As bytes: piece r of the joint input is inputs[r]; outputs likewise.
  std::vector<at::Tensor> parts;
  std::vector<int64_t> in_splits, out_splits;
  int64_t out_total = 0;
  for (int r = 0; r < size_; ++r) {
    check_movable(title, inputs[r]);
    check_movable(title, outputs[r]);
    parts.push_back(bytes_of(inputs[r]));
    in_splits.push_back(static_cast<int64_t>(nbytes(inputs[r])));
    out_splits.push_back(static_cast<int64_t>(nbytes(outputs[r])));
    out_total += out_splits.back();
  }
  at::Tensor joint_in = at::cat(parts);
  at::Tensor joint_out = at::empty({out_total}, joint_in.options());
  auto work = all_to_all_uneven(joint_out, joint_in, out_splits, in_splits, /*async=*/false);
  work->wait();
  int64_t at = 0;
  for (int r = 0; r < size_; ++r) {
    outputs[r].copy_(joint_out.narrow(0, at, out_splits[r])
                         .view(outputs[r].scalar_type())
                         .view(outputs[r].sizes()));
    at += out_splits[r];
  }
  (void)opts;
  return work;
}

}  // namespace ddprun_torch
