#pragma once
// The c10d Work the "ddp" backend returns: completed once, with the
// collective's outputs or its error, and a future that DDP's communication
// hooks chain on. Thread-safe.

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <exception>
#include <vector>

namespace ddprun_torch {

class DdpWork : public c10d::Work {
 public:
  DdpWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs);

  // Marks the work done (error null: success) and completes its future with
  // the outputs, or with the error. Called once, by whoever ran the collective.
  void complete(std::exception_ptr error);

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  // A recv's source (set before complete(); what recv from any source found).
  void set_source_rank(int rank) { source_rank_ = rank; }
  int sourceRank() const override { return source_rank_; }
  std::vector<at::Tensor> result() override;

 private:
  std::vector<at::Tensor> outputs_;
  std::atomic<int> source_rank_{-1};
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace ddprun_torch
