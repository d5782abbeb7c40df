#include "cuda_util.h"

#include <dlfcn.h>

#include <vector>

namespace train {
namespace {

std::string dl_error() {
  const char* e = ::dlerror();
  return e != nullptr ? e : "unknown error";
}

template <typename F>
F symbol(void* library, const char* name, const std::string& path) {
  void* f = ::dlsym(library, name);
  if (f == nullptr) throw ddp::Error("cuBLAS: " + path + " has no " + name + ": " + dl_error());
  return reinterpret_cast<F>(f);
}

Cublas load_cublas() {
  // The soname first (the program's RUNPATH, LD_LIBRARY_PATH, ld.so.cache),
  // then the library this program was built against.
  const std::vector<std::string> candidates = {
      "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR),
#ifdef DDP_TRAIN_CUBLAS_LIBRARY
      DDP_TRAIN_CUBLAS_LIBRARY,
#endif
  };
  void* library = nullptr;
  std::string path, errors;
  for (const auto& candidate : candidates) {
    library = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) {
      path = candidate;
      break;
    }
    errors += (errors.empty() ? "" : "; ") + dl_error();
  }
  if (library == nullptr) throw ddp::Error("cuBLAS could not be loaded: " + errors);
  Cublas api{};
  api.create = symbol<decltype(api.create)>(library, "cublasCreate_v2", path);
  api.destroy = symbol<decltype(api.destroy)>(library, "cublasDestroy_v2", path);
  api.set_stream = symbol<decltype(api.set_stream)>(library, "cublasSetStream_v2", path);
  api.set_math_mode = symbol<decltype(api.set_math_mode)>(library, "cublasSetMathMode", path);
  api.sgemm = symbol<decltype(api.sgemm)>(library, "cublasSgemm_v2", path);
  api.sgemv = symbol<decltype(api.sgemv)>(library, "cublasSgemv_v2", path);
  api.status_name = symbol<decltype(api.status_name)>(library, "cublasGetStatusName", path);
  api.status_string = symbol<decltype(api.status_string)>(library, "cublasGetStatusString", path);
  return api;  // the library stays loaded for the life of the process
}

}  // namespace

const Cublas& cublas() {
  static const Cublas api = load_cublas();
  return api;
}

void* DeviceMemory::allocate(std::size_t bytes) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc");
  const cudaError_t e = cudaMemset(p, 0, bytes);
  if (e != cudaSuccess) {
    (void)cudaFree(p);
    check_cuda(e, "cudaMemset");
  }
  return p;
}

void* PinnedMemory::allocate(std::size_t bytes) {
  void* p = nullptr;
  check_cuda(cudaMallocHost(&p, bytes == 0 ? 1 : bytes), "cudaMallocHost");
  return p;
}

Gpu::Gpu(int device) : device_(device) {
  check_cuda(cudaSetDevice(device), "cudaSetDevice", device);
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties", device);
  name_ = device_label(device) + " (" + prop.name + ")";
  check_cuda(cudaStreamCreate(&stream_), "cudaStreamCreate");
  try {
    check_cublas(cublas().create(&blas_), "cublasCreate");
    check_cublas(cublas().set_stream(blas_, stream_), "cublasSetStream");
    // Plain FP32 GEMMs (no TF32), as on the CPU: the GPU's loss curve then
    // matches the CPU's to float rounding.
    check_cublas(cublas().set_math_mode(blas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  } catch (...) {
    if (blas_ != nullptr) (void)cublas().destroy(blas_);
    (void)cudaStreamDestroy(stream_);
    throw;
  }
}

Gpu::~Gpu() {
  (void)cudaStreamSynchronize(stream_);
  (void)cublas().destroy(blas_);
  (void)cudaStreamDestroy(stream_);
}

void Gpu::synchronize(const char* what) const {
  const cudaError_t e = cudaStreamSynchronize(stream_);
  if (e != cudaSuccess)
    check_cuda(e, ("cudaStreamSynchronize (" + std::string(what) + ")").c_str(), device_);
}

void copy_to_device(const Gpu& gpu, void* device, const void* host, std::size_t bytes) {
  check_cuda(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, gpu.stream()),
             "cudaMemcpyAsync (host to device)");
  gpu.synchronize("copy to device");
}

void copy_to_host(const Gpu& gpu, void* host, const void* device, std::size_t bytes) {
  check_cuda(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, gpu.stream()),
             "cudaMemcpyAsync (device to host)");
  gpu.synchronize("copy to host");
}

}  // namespace train
