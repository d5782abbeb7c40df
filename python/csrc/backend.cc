#include "backend.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <utility>

#include "ddp/common/error.h"
#include "dtypes.h"
#include "group_setup.h"
#include "torch_store.h"
#include "work.h"

namespace ddprun_torch {

DdpBackend::DdpBackend(BackendSetup setup)
    : c10d::Backend(setup.rank, setup.size), setup_(std::move(setup)) {
  store_ = wrap_torch_store(setup_.store);
  try {
    cpu_ = make_cpu_group(setup_, store_);
  } catch (const ddp::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

DdpBackend::~DdpBackend() = default;

ddp::ProcessGroup& DdpBackend::group_for(const char* collective, const at::Device& device) {
  if (device.is_cpu()) return *cpu_;
  TORCH_CHECK_VALUE(device.is_cuda(), "backend ddp: ", collective, " got a tensor on device ",
                    device.str(), "; it runs CPU and CUDA tensors");
  std::lock_guard<std::mutex> lock(cuda_mu_);
  if (!cuda_) {
    try {
      cuda_ = make_cuda_group(setup_, store_, device.index());
    } catch (const ddp::Error& e) {
      TORCH_CHECK(false, "backend ddp: ", collective, " on ", device.str(),
                  " needs libddp's NCCL group: ", e.what());
    }
  }
  return *cuda_;
}

double DdpBackend::time_libddp_all_reduce(const at::Tensor& tensor, int iterations) {
  TORCH_CHECK_VALUE(tensor.is_cpu() && tensor.is_contiguous() && native_dtype(tensor.scalar_type()),
                    "time_libddp_all_reduce takes a contiguous CPU tensor of a native dtype");
  const auto dtype = *native_dtype(tensor.scalar_type());
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) {
    cpu_->all_reduce(tensor.data_ptr(), static_cast<std::size_t>(tensor.numel()), dtype);
  }
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  return took.count() / std::max(iterations, 1);
}

c10::intrusive_ptr<c10d::Work> DdpBackend::run(c10d::OpType type, const char* title, bool async,
                                               const at::Device& device,
                                               std::vector<at::Tensor> outputs, Issue issue,
                                               std::function<void()> after) {
  ddp::ProcessGroup& group = group_for(title, device);
  // libddp's NCCL group runs on a stream of its own: what torch queued on
  // the device must be done first.
  if (device.is_cuda()) at::detail::getCUDAHooks().deviceSynchronize(device.index());
  ++issued_;
  auto work = c10::make_intrusive<DdpWork>(rank_, type, title, std::move(outputs));
  auto finish = [work, after = std::move(after)](std::exception_ptr error) {
    if (!error && after) {
      try {
        after();
      } catch (...) {
        error = std::current_exception();
      }
    }
    work->complete(error);
  };
  if (!async) {
    std::exception_ptr error;
    try {
      issue(group, false);
    } catch (...) {
      error = std::current_exception();
    }
    finish(error);
    return work;
  }
  std::shared_ptr<ddp::Work> queued;
  try {
    queued = issue(group, true);
  } catch (...) {
    finish(std::current_exception());
    return work;
  }
  if (!queued) {  // nothing to move (empty tensors): done already
    finish(nullptr);
    return work;
  }
  // libddp holds only pointers: the tensors `issue` captured (inputs the
  // caller may drop at once) live until the collective is done.
  queued->on_finish([finish = std::move(finish),
                     keep = std::move(issue)](std::exception_ptr error) { finish(error); });
  return work;
}

}  // namespace ddprun_torch
