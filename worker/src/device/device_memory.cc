#include "device/device_memory.h"

#include <string>

#include "ddp/common/error.h"

namespace ddp::device {

#ifdef DDP_HAVE_NCCL

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}

Scope::Scope(int device) {
  check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
  if (device != previous_) check_cuda(cudaSetDevice(device), "cudaSetDevice");
}

Scope::~Scope() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

std::shared_ptr<void> allocate(std::size_t bytes, int device) {
  Scope scope(device);
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc");
  return std::shared_ptr<void>(p, [](void* q) { (void)cudaFree(q); });
}

void zero(void* p, std::size_t bytes) {
  check_cuda(cudaMemsetAsync(p, 0, bytes, 0), "cudaMemsetAsync");
  check_cuda(cudaStreamSynchronize(0), "cudaStreamSynchronize");
}

void copy(void* dst, const void* src, std::size_t bytes) {
  check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy");
  check_cuda(cudaStreamSynchronize(0), "cudaStreamSynchronize");
}

#else

namespace {
[[noreturn]] void no_cuda() {
  throw Error("device memory needs CUDA, and this libddp was built without it");
}
}  // namespace

Scope::Scope(int) {}
Scope::~Scope() = default;
std::shared_ptr<void> allocate(std::size_t, int) { no_cuda(); }
void zero(void*, std::size_t) { no_cuda(); }
void copy(void*, const void*, std::size_t) { no_cuda(); }

#endif

}  // namespace ddp::device
