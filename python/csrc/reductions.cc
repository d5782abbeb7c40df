// The reducing collectives: all_reduce (plain and coalesced), reduce and
// reduce_scatter (list, single tensor, coalesced). A (dtype, op) pair
// libddp reduces natively goes straight to it; any other is gathered and
// reduced with torch's operators (dtypes.h).
#include <c10/util/Exception.h>

#include "backend.h"
#include "dtypes.h"
#include "tensors.h"

namespace ddprun_torch {

c10::intrusive_ptr<c10d::Work> DdpBackend::reduce_into(c10d::OpType type, const char* title,
                                                       bool async, at::Tensor data,
                                                       const c10d::ReduceOp& op, int root,
                                                       std::vector<at::Tensor> outputs,
                                                       std::function<void()> after) {
  const auto count = static_cast<std::size_t>(data.numel());
  if (auto native = native_op(op, data.scalar_type()); native) {
    const ddp::DType dtype = *native_dtype(data.scalar_type());
    const ddp::ReduceOp ddp_op = *native;
    Issue issue = [data, count, dtype, ddp_op, root](ddp::ProcessGroup& g,
                                                     bool queued) -> std::shared_ptr<ddp::Work> {
      if (count == 0) return nullptr;
      if (root < 0) {
        if (queued) return g.all_reduce_async(data.data_ptr(), count, dtype, ddp_op);
        g.all_reduce(data.data_ptr(), count, dtype, ddp_op);
      } else {
        if (queued) return g.reduce_async(data.data_ptr(), count, dtype, ddp_op, root);
        g.reduce(data.data_ptr(), count, dtype, ddp_op, root);
      }
      return nullptr;
    };
    return run(type, title, async, data.device(), std::move(outputs), issue, std::move(after));
  }
  // Gathered: every rank's bytes, then torch's reduction where the result is wanted.
  at::Tensor gathered = at::empty({size_, data.numel()}, data.options());
  const std::size_t bytes = nbytes(data);
  Issue issue = [data, gathered, bytes](ddp::ProcessGroup& g,
                                        bool queued) -> std::shared_ptr<ddp::Work> {
    if (bytes == 0) return nullptr;
    if (queued)
      return g.all_gather_async(data.data_ptr(), gathered.data_ptr(), bytes, ddp::DType::kUInt8);
    g.all_gather(data.data_ptr(), gathered.data_ptr(), bytes, ddp::DType::kUInt8);
    return nullptr;
  };
  const bool wanted_here = root < 0 || root == rank_;
  auto reduce_then = [data, gathered, op, wanted_here, after = std::move(after)]() mutable {
    if (wanted_here && data.numel() > 0) data.copy_(reduce_gathered(gathered, op).view_as(data));
    if (after) after();
  };
  return run(type, title, async, data.device(), std::move(outputs), issue, reduce_then);
}

c10::intrusive_ptr<c10d::Work> DdpBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceOptions& opts) {
  at::Tensor target = single("all_reduce", tensors);
  check_reducible("all_reduce", opts.reduceOp, target.scalar_type());
  at::Tensor data = contiguous(target);
  return reduce_into(c10d::OpType::ALLREDUCE, "all_reduce", opts.asyncOp, data, opts.reduceOp, -1,
                     {target}, [target, data]() mutable { copy_back(target, data); });
}

c10::intrusive_ptr<c10d::Work> DdpBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK_VALUE(!tensors.empty(), "backend ddp: all_reduce_coalesced got no tensors");
  check_like("all_reduce_coalesced", "input", tensors, tensors[0], tensors.size());
  check_reducible("all_reduce_coalesced", opts.reduceOp, tensors[0].scalar_type());
  std::vector<at::Tensor> flats;
  for (const auto& t : tensors) flats.push_back(t.reshape({-1}));
  at::Tensor flat = at::cat(flats);
  auto split_back = [targets = tensors, flat]() mutable {
    int64_t at = 0;
    for (auto& t : targets) {
      t.copy_(flat.narrow(0, at, t.numel()).view_as(t));
      at += t.numel();
    }
  };
  return reduce_into(c10d::OpType::ALLREDUCE_COALESCED, "all_reduce_coalesced", opts.asyncOp, flat,
                     opts.reduceOp, -1, tensors, split_back);
}

c10::intrusive_ptr<c10d::Work> DdpBackend::reduce(std::vector<at::Tensor>& tensors,
                                                  const c10d::ReduceOptions& opts) {
  at::Tensor target = single("reduce", tensors);
  check_reducible("reduce", opts.reduceOp, target.scalar_type());
  TORCH_CHECK_VALUE(opts.rootRank >= 0 && opts.rootRank < size_, "backend ddp: reduce: root rank ",
                    opts.rootRank, " is not in a group of ", size_);
  at::Tensor data = contiguous(target);
  const bool here = opts.rootRank == rank_;
  return reduce_into(c10d::OpType::REDUCE, "reduce", opts.asyncOp, data, opts.reduceOp,
                     static_cast<int>(opts.rootRank), {target}, [target, data, here]() mutable {
                       if (here) copy_back(target, data);
                     });
}

c10::intrusive_ptr<c10d::Work> DdpBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  return reduce_scatter_into(output, input, opts, {output}, nullptr);
}

c10::intrusive_ptr<c10d::Work> DdpBackend::reduce_scatter_into(
    at::Tensor output, at::Tensor input, const c10d::ReduceScatterOptions& opts,
    std::vector<at::Tensor> outputs, std::function<void()> after) {
  const char* title = "reduce_scatter_tensor";
  check_movable(title, input);
  check_like(title, "output", {output}, output, 1);
  check_reducible(title, opts.reduceOp, input.scalar_type());
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "backend ddp: ", title,
                   ": output dtype ", output.scalar_type(), " differs from the input's ",
                   input.scalar_type());
  TORCH_CHECK_VALUE(input.numel() == output.numel() * size_, "backend ddp: ", title,
                    ": the input has ", input.numel(), " elements; it needs the output's ",
                    output.numel(), " times the group's ", size_);
  at::Tensor in = contiguous(input);
  at::Tensor out = contiguous(output);
  auto native = native_op(opts.reduceOp, in.scalar_type());
  if (!native) {
    // Gathered: reduce the whole input, keep this rank's slice.
    at::Tensor whole = in.clone();
    const int64_t n = out.numel();
    const int64_t first = n * rank_;
    return reduce_into(c10d::OpType::REDUCE_SCATTER, title, opts.asyncOp, whole, opts.reduceOp, -1,
                       std::move(outputs), [output, whole, n, first, after]() mutable {
                         output.copy_(whole.reshape({-1}).narrow(0, first, n).view_as(output));
                         if (after) after();
                       });
  }
  const ddp::DType dtype = *native_dtype(in.scalar_type());
  const ddp::ReduceOp op = *native;
  const auto count = static_cast<std::size_t>(out.numel());
  Issue issue = [in, out, count, dtype, op](ddp::ProcessGroup& g,
                                            bool queued) -> std::shared_ptr<ddp::Work> {
    if (count == 0) return nullptr;
    if (queued) return g.reduce_scatter_async(in.data_ptr(), out.data_ptr(), count, dtype, op);
    g.reduce_scatter(in.data_ptr(), out.data_ptr(), count, dtype, op);
    return nullptr;
  };
  return run(c10d::OpType::REDUCE_SCATTER, title, opts.asyncOp, in.device(), std::move(outputs),
             issue, [output, out, after]() mutable {
               copy_back(output, out);
               if (after) after();
             });
}

}  // namespace ddprun_torch

namespace ddprun_torch {

c10::intrusive_ptr<c10d::Work> DdpBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  at::Tensor output = single("reduce_scatter", outputs);
  TORCH_CHECK_VALUE(inputs.size() == 1, "backend ddp: reduce_scatter takes one input list; got ",
                    inputs.size());
  check_like("reduce_scatter", "input", inputs[0], output, static_cast<std::size_t>(size_));
  std::vector<at::Tensor> flats;
  for (const auto& t : inputs[0]) flats.push_back(t.reshape({-1}));
  at::Tensor flat = at::cat(flats);
  return _reduce_scatter_base(output, flat, opts);
}

c10::intrusive_ptr<c10d::Work> DdpBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(
      !outputs.empty() && outputs.size() == inputs.size(),
      "backend ddp: reduce_scatter_tensor_coalesced needs as many outputs as inputs (",
      outputs.size(), " and ", inputs.size(), ")");
  // Rank r's slice of the joint input is every input's slice r, one after another.
  std::vector<at::Tensor> rows;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    check_like("reduce_scatter_tensor_coalesced", "output", {outputs[i]}, outputs[0], 1);
    TORCH_CHECK_VALUE(inputs[i].numel() == outputs[i].numel() * size_,
                      "backend ddp: reduce_scatter_tensor_coalesced: input ", i, " has ",
                      inputs[i].numel(), " elements; it needs output ", i, "'s ",
                      outputs[i].numel(), " times the group's ", size_);
    rows.push_back(inputs[i].reshape({size_, -1}));
  }
  at::Tensor joint_in = at::cat(rows, 1).reshape({-1});
  int64_t total = 0;
  for (const auto& t : outputs) total += t.numel();
  at::Tensor joint_out = at::empty({total}, joint_in.options());
  auto split = [targets = outputs, joint_out]() mutable {
    int64_t at = 0;
    for (auto& t : targets) {
      t.copy_(joint_out.narrow(0, at, t.numel()).view_as(t));
      at += t.numel();
    }
  };
  return reduce_scatter_into(joint_out, joint_in, opts, outputs, split);
}

}  // namespace ddprun_torch
