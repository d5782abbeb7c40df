// gpu_runtime.h's out-of-line parts: loading cuBLAS, the Gpu's set-up and
// tear-down, and the blocking copies.

#include "gpu_runtime.h"

#include <dlfcn.h>

#include <type_traits>
#include <vector>

namespace train {

const Cublas& cublas() {
  static const Cublas api = [] {
    std::vector<std::string> candidates = {"libcublas.so." + std::to_string(CUBLAS_VER_MAJOR)};
#ifdef DDP_TRAIN_CUBLAS_LIBRARY
    candidates.push_back(DDP_TRAIN_CUBLAS_LIBRARY);
#endif
    void* library = nullptr;
    std::string path, errors;
    for (const auto& candidate : candidates) {
      if ((library = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL)) != nullptr) {
        path = candidate;
        break;
      }
      const char* why = ::dlerror();
      errors += (errors.empty() ? "" : "; ") + std::string(why != nullptr ? why : candidate);
    }
    if (library == nullptr) throw ddp::Error("cuBLAS could not be loaded: " + errors);
    const auto symbol = [&](auto& f, const char* name) {
      void* p = ::dlsym(library, name);
      if (p == nullptr) throw ddp::Error("cuBLAS: " + path + " has no " + name);
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(p);
    };
    Cublas c{};
    symbol(c.create, "cublasCreate_v2");
    symbol(c.destroy, "cublasDestroy_v2");
    symbol(c.set_stream, "cublasSetStream_v2");
    symbol(c.set_math_mode, "cublasSetMathMode");
    symbol(c.sgemm, "cublasSgemm_v2");
    symbol(c.sgemv, "cublasSgemv_v2");
    symbol(c.status_name, "cublasGetStatusName");
    symbol(c.status_string, "cublasGetStatusString");
    return c;
  }();
  return api;
}

void check_cublas(cublasStatus_t s, const char* call) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  int device = -1;
  (void)cudaGetDevice(&device);
  throw ddp::Error(device_label(device) + ": " + call + ": " + cublas().status_name(s) + " (" +
                   cublas().status_string(s) + ")");
}

Gpu::Gpu(int device) : device_(device) {
  check_cuda(cudaSetDevice(device), "cudaSetDevice", device);
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties", device);
  name_ = device_label(device) + " (" + prop.name + ")";
  check_cuda(cudaStreamCreate(&stream_), "cudaStreamCreate");
  check_cublas(cublas().create(&blas_), "cublasCreate");
  check_cublas(cublas().set_stream(blas_, stream_), "cublasSetStream");
  // Plain FP32 GEMMs (no TF32), as on the CPU: the GPU's loss curve then
  // matches the CPU's to float rounding.
  check_cublas(cublas().set_math_mode(blas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
}
Gpu::~Gpu() {
  (void)cudaStreamSynchronize(stream_);
  (void)cublas().destroy(blas_);
  (void)cudaStreamDestroy(stream_);
}

void copy_to_device(const Gpu& gpu, void* device, const void* host, std::size_t bytes) {
  check_cuda(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, gpu.stream()),
             "cudaMemcpyAsync (host to device)");
  check_cuda(cudaStreamSynchronize(gpu.stream()), "cudaStreamSynchronize (copy to device)");
}
void copy_to_host(const Gpu& gpu, void* host, const void* device, std::size_t bytes) {
  check_cuda(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, gpu.stream()),
             "cudaMemcpyAsync (device to host)");
  check_cuda(cudaStreamSynchronize(gpu.stream()), "cudaStreamSynchronize (copy to host)");
}

}  // namespace train
