#pragma once
// The c10d backend "ddp": torch.distributed's collectives over libddp.
//
// CPU tensors go through one libddp ProcessGroup made over the store torch
// hands the backend: shared memory among the group's ranks of one node, Gloo
// over TCP across nodes (libddp's "shm" backend), or Gloo alone when no node
// holds two of its ranks. CUDA tensors go through a second, NCCL group,
// made at the first CUDA collective, where libddp was built with NCCL.
//
// A call with asyncOp false (torch's blocking form) runs on the caller's
// thread and returns a completed Work; an async call is queued on the
// libddp group's thread and completes its Work (and future) there. Either
// way the collectives run in issue order, as every rank must issue them.
// Errors: a call torch's Gloo would also refuse (an op, dtype, device or
// shape) throws at once, naming the collective and what is wrong; a
// collective that fails later (a peer gone, a timeout naming the ranks that
// never arrived) fails its Work with libddp's message.

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ddp/process_group.h"

namespace ddprun_torch {

struct BackendSetup {
  c10::intrusive_ptr<c10d::Store> store;  // already scoped to this group by torch
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  std::string group_id;               // torch's name for the group ("0", a hash, ...)
  std::vector<int64_t> global_ranks;  // the group's ranks in the default group
};

class DdpBackend : public c10d::Backend {
 public:
  // Collective over the group's ranks: they meet through setup.store, agree
  // on which of them share a node, and form the libddp group. Throws
  // c10::Error naming what is wrong (a peer that never arrived: the ranks
  // missing after the timeout).
  explicit DdpBackend(BackendSetup setup);
  ~DdpBackend() override;

  const std::string getBackendName() const override { return "ddp"; }
  // Which libddp backend carries CPU tensors ("shm", "gloo" or "local").
  std::string cpu_transport() const { return cpu_->backend_name(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  uint64_t getSequenceNumberForGroup() override { return issued_.load(); }

  // For benchmarks: the mean seconds of `iterations` blocking all_reduce
  // (sum) calls of the contiguous CPU `tensor` made straight on libddp's
  // group, without c10d: the floor the backend's own cost is measured from.
  // Collective, as all_reduce.
  double time_libddp_all_reduce(const at::Tensor& tensor, int iterations);

 private:
  // Starts `collective` on `group`: blocking (nullptr back) or async (its
  // Work; nullptr when there was nothing to do: empty tensors).
  using Issue = std::function<std::shared_ptr<ddp::Work>(ddp::ProcessGroup& group, bool async)>;
  // Runs `issue` on the group for `device`, then `after` (copy-backs, the
  // reduction of gathered inputs) once it succeeded; the Work returned holds
  // `outputs` as its result.
  c10::intrusive_ptr<c10d::Work> run(c10d::OpType type, const char* title, bool async,
                                     const at::Device& device, std::vector<at::Tensor> outputs,
                                     Issue issue, std::function<void()> after = nullptr);
  // The libddp group for tensors on `device` (made at the first CUDA use).
  ddp::ProcessGroup& group_for(const char* collective, const at::Device& device);
  // An all_reduce of the contiguous `data` (in place), natively or gathered.
  c10::intrusive_ptr<c10d::Work> reduce_into(c10d::OpType type, const char* title, bool async,
                                             at::Tensor data, const c10d::ReduceOp& op, int root,
                                             std::vector<at::Tensor> outputs,
                                             std::function<void()> after);
  // all_gather (root < 0) or gather to `root` of the bytes `in` into `out`.
  c10::intrusive_ptr<c10d::Work> gather_bytes(c10d::OpType type, const char* title, bool async,
                                              at::Tensor in, at::Tensor out, int root,
                                              std::vector<at::Tensor> outputs,
                                              std::function<void()> after);
  // reduce_scatter of `input` into `output`, then `after`; the Work holds `outputs`.
  c10::intrusive_ptr<c10d::Work> reduce_scatter_into(at::Tensor output, at::Tensor input,
                                                     const c10d::ReduceScatterOptions& opts,
                                                     std::vector<at::Tensor> outputs,
                                                     std::function<void()> after);
  c10::intrusive_ptr<c10d::Work> all_to_all_uneven(at::Tensor output, at::Tensor input,
                                                   std::vector<int64_t> output_splits,
                                                   std::vector<int64_t> input_splits, bool async);

  BackendSetup setup_;
  std::shared_ptr<ddp::Store> store_;
  std::shared_ptr<ddp::ProcessGroup> cpu_;
  std::shared_ptr<ddp::ProcessGroup> cuda_;
  std::mutex cuda_mu_;
  std::atomic<uint64_t> issued_{0};
  // Point-to-point messages, counted per (peer, tag) so each send meets its recv.
  std::mutex p2p_mu_;
  std::map<std::pair<int, int>, uint64_t> sent_, received_;
};

}  // namespace ddprun_torch
