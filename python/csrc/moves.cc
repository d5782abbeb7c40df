// The collectives that move bytes without reducing them: broadcast, the
// all_gather family, gather, scatter, all_to_all and barrier. Every dtype
// moves as its bytes, so none is refused for its element type.
#include <c10/util/Exception.h>

#include <algorithm>

#include "backend.h"
#include "dtypes.h"
#include "tensors.h"

namespace ddprun_torch {
namespace {

constexpr auto kBytes = ddp::DType::kUInt8;

void check_root(const char* collective, int64_t root, int size) {
  TORCH_CHECK_VALUE(root >= 0 && root < size, "backend ddp: ", collective, ": root rank ", root,
                    " is not in a group of ", size);
}

// Copies slice i (`each` bytes) of the flat `bytes` into targets[i].
void scatter_slices(const at::Tensor& bytes, std::vector<at::Tensor>& targets, int64_t each) {
  for (std::size_t i = 0; i < targets.size(); ++i) {
    auto slice = bytes.narrow(0, static_cast<int64_t>(i) * each, each);
    targets[i].copy_(slice.view(targets[i].scalar_type()).view(targets[i].sizes()));
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Work> DdpBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                     const c10d::BroadcastOptions& opts) {
  at::Tensor target = single("broadcast", tensors);
  check_root("broadcast", opts.rootRank, size_);
  at::Tensor data = contiguous(target);
  const int root = static_cast<int>(opts.rootRank);
  const std::size_t bytes = nbytes(data);
  Issue issue = [data, bytes, root](ddp::ProcessGroup& g,
                                    bool queued) -> std::shared_ptr<ddp::Work> {
    if (bytes == 0) return nullptr;
    if (queued) return g.broadcast_async(data.data_ptr(), bytes, kBytes, root);
    g.broadcast(data.data_ptr(), bytes, kBytes, root);
    return nullptr;
  };
  return run(c10d::OpType::BROADCAST, "broadcast", opts.asyncOp, data.device(), {target}, issue,
             [target, data]() mutable { copy_back(target, data); });
}

c10::intrusive_ptr<c10d::Work> DdpBackend::gather_bytes(c10d::OpType type, const char* title,
                                                        bool async, at::Tensor in, at::Tensor out,
                                                        int root, std::vector<at::Tensor> outputs,
                                                        std::function<void()> after) {
  const std::size_t bytes = nbytes(in);
  Issue issue = [in, out, bytes, root](ddp::ProcessGroup& g,
                                       bool queued) -> std::shared_ptr<ddp::Work> {
    if (bytes == 0) return nullptr;
    void* dst = out.defined() ? out.data_ptr() : nullptr;
    if (root < 0) {
      if (queued) return g.all_gather_async(in.data_ptr(), dst, bytes, kBytes);
      g.all_gather(in.data_ptr(), dst, bytes, kBytes);
    } else {
      if (queued) return g.gather_async(in.data_ptr(), dst, bytes, kBytes, root);
      g.gather(in.data_ptr(), dst, bytes, kBytes, root);
    }
    return nullptr;
  };
  return run(type, title, async, in.device(), std::move(outputs), issue, std::move(after));
}

c10::intrusive_ptr<c10d::Work> DdpBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) {
  at::Tensor input = single("all_gather", inputs);
  TORCH_CHECK_VALUE(outputs.size() == 1, "backend ddp: all_gather takes one output list; got ",
                    outputs.size());
  check_like("all_gather", "output", outputs[0], input, static_cast<std::size_t>(size_));
  at::Tensor in = bytes_of(input);
  at::Tensor flat = at::empty({in.numel() * size_}, in.options());
  auto targets = outputs[0];
  const int64_t each = in.numel();
  return gather_bytes(c10d::OpType::ALLGATHER, "all_gather", opts.asyncOp, in, flat, -1, targets,
                      [flat, targets, each]() mutable { scatter_slices(flat, targets, each); });
}

c10::intrusive_ptr<c10d::Work> DdpBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                           const c10d::AllgatherOptions& opts) {
  const char* title = "all_gather_into_tensor";
  check_movable(title, input);
  check_movable(title, output);
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "backend ddp: ", title,
                   ": output dtype ", output.scalar_type(), " differs from the input's ",
                   input.scalar_type());
  TORCH_CHECK_VALUE(output.numel() == input.numel() * size_, "backend ddp: ", title,
                    ": the output has ", output.numel(), " elements; it needs the input's ",
                    input.numel(), " times the group's ", size_);
  at::Tensor out = contiguous(output);
  at::Tensor target = output;
  return gather_bytes(c10d::OpType::_ALLGATHER_BASE, title, opts.asyncOp, bytes_of(input),
                      bytes_of(out), -1, {target},
                      [target, out]() mutable { copy_back(target, out); });
}

c10::intrusive_ptr<c10d::Work> DdpBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* title = "all_gather_into_tensor_coalesced";
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "backend ddp: ", title,
                    " needs as many outputs as inputs (", outputs.size(), " and ", inputs.size(),
                    ")");
  // As all_gather_coalesced's lists: lists[r][i] is rank r's piece of output i.
  std::vector<std::vector<at::Tensor>> lists(static_cast<std::size_t>(size_));
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK_VALUE(outputs[i].numel() == inputs[i].numel() * size_, "backend ddp: ", title,
                      ": output ", i, " has ", outputs[i].numel(), " elements; it needs input ", i,
                      "'s ", inputs[i].numel(), " times the group's ", size_);
    auto pieces = outputs[i].reshape({-1}).chunk(size_);
    for (int r = 0; r < size_; ++r) lists[r].push_back(pieces[r].view_as(inputs[i]));
  }
  return allgather_coalesced(lists, inputs, opts);
}

// outputs[r][i] receives rank r's inputs[i].
c10::intrusive_ptr<c10d::Work> DdpBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* title = "all_gather_coalesced";
  TORCH_CHECK_VALUE(static_cast<int>(outputs.size()) == size_, "backend ddp: ", title,
                    " needs one output list per rank (", size_, "); got ", outputs.size());
  std::vector<at::Tensor> parts;
  for (const auto& input : inputs) {
    check_movable(title, input);
    parts.push_back(bytes_of(input));
  }
  for (const auto& list : outputs) {
    TORCH_CHECK_VALUE(list.size() == inputs.size(), "backend ddp: ", title,
                      ": each rank's output list needs one tensor per input (", inputs.size(),
                      "); got ", list.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      check_like(title, "output", {list[i]}, inputs[i], 1);
    }
  }
  at::Tensor in = parts.empty() ? at::empty({0}, at::kByte) : at::cat(parts);
  at::Tensor flat = at::empty({in.numel() * size_}, in.options());
  std::vector<at::Tensor> result;
  for (const auto& list : outputs) result.insert(result.end(), list.begin(), list.end());
  auto unpack = [flat, outputs, each = in.numel()]() mutable {
    for (std::size_t r = 0; r < outputs.size(); ++r) {
      int64_t offset = static_cast<int64_t>(r) * each;
      for (auto& out : outputs[r]) {
        const auto n = static_cast<int64_t>(nbytes(out));
        out.copy_(flat.narrow(0, offset, n).view(out.scalar_type()).view(out.sizes()));
        offset += n;
      }
    }
  };
  return gather_bytes(c10d::OpType::ALLGATHER_COALESCED, title, opts.asyncOp, in, flat, -1, result,
                      unpack);
}

c10::intrusive_ptr<c10d::Work> DdpBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                  std::vector<at::Tensor>& inputs,
                                                  const c10d::GatherOptions& opts) {
  at::Tensor input = single("gather", inputs);
  check_root("gather", opts.rootRank, size_);
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor in = bytes_of(input);
  if (rank_ != root) {
    TORCH_CHECK_VALUE(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                      "backend ddp: gather: only the root rank ", root, " passes output tensors");
    return gather_bytes(c10d::OpType::GATHER, "gather", opts.asyncOp, in, at::Tensor(), root, {},
                        nullptr);
  }
  TORCH_CHECK_VALUE(outputs.size() == 1,
                    "backend ddp: gather: the root takes one output list; got ", outputs.size());
  check_like("gather", "output", outputs[0], input, static_cast<std::size_t>(size_));
  at::Tensor flat = at::empty({in.numel() * size_}, in.options());
  auto targets = outputs[0];
  return gather_bytes(
      c10d::OpType::GATHER, "gather", opts.asyncOp, in, flat, root, targets,
      [flat, targets, each = in.numel()]() mutable { scatter_slices(flat, targets, each); });
}

c10::intrusive_ptr<c10d::Work> DdpBackend::scatter(std::vector<at::Tensor>& outputs,
                                                   std::vector<std::vector<at::Tensor>>& inputs,
                                                   const c10d::ScatterOptions& opts) {
  at::Tensor output = single("scatter", outputs);
  check_root("scatter", opts.rootRank, size_);
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor flat;
  if (rank_ == root) {
    TORCH_CHECK_VALUE(inputs.size() == 1,
                      "backend ddp: scatter: the root takes one input list; got ", inputs.size());
    check_like("scatter", "input", inputs[0], output, static_cast<std::size_t>(size_));
    std::vector<at::Tensor> parts;
    for (const auto& t : inputs[0]) parts.push_back(bytes_of(t));
    flat = at::cat(parts);
  } else {
    TORCH_CHECK_VALUE(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                      "backend ddp: scatter: only the root rank ", root, " passes input tensors");
  }
  at::Tensor out = bytes_of(output);
  const std::size_t bytes = nbytes(out);
  Issue issue = [flat, out, bytes, root](ddp::ProcessGroup& g,
                                         bool queued) -> std::shared_ptr<ddp::Work> {
    if (bytes == 0) return nullptr;
    const void* src = flat.defined() ? flat.data_ptr() : nullptr;
    if (queued) return g.scatter_async(src, out.data_ptr(), bytes, kBytes, root);
    g.scatter(src, out.data_ptr(), bytes, kBytes, root);
    return nullptr;
  };
  at::Tensor target = output;
  return run(c10d::OpType::SCATTER, "scatter", opts.asyncOp, output.device(), {target}, issue,
             [target, out]() mutable {
               if (!target.is_alias_of(out))
                 target.copy_(out.view(target.scalar_type()).view(target.sizes()));
             });
}

c10::intrusive_ptr<c10d::Work> DdpBackend::barrier(const c10d::BarrierOptions& opts) {
  Issue issue = [](ddp::ProcessGroup& g, bool queued) -> std::shared_ptr<ddp::Work> {
    if (queued) return g.barrier_async();
    g.barrier();
    return nullptr;
  };
  return run(c10d::OpType::BARRIER, "barrier", opts.asyncOp, at::Device(at::kCPU), {}, issue);
}

}  // namespace ddprun_torch
