#include "work.h"

#include <ATen/core/ivalue.h>

#include <utility>

namespace ddprun_torch {

DdpWork::DdpWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type, title),
      outputs_(std::move(outputs)),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
}

void DdpWork::complete(std::exception_ptr error) {
  finish(error);
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
}

c10::intrusive_ptr<c10::ivalue::Future> DdpWork::getFuture() { return future_; }

std::vector<at::Tensor> DdpWork::result() { return outputs_; }

}  // namespace ddprun_torch
