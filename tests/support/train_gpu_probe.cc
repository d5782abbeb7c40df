#include "train_gpu_probe.h"

#include <chrono>
#include <map>
#include <mutex>

namespace ddp::testing {

namespace {

GpuProbe probe(const std::string& trainer) {
  using namespace std::chrono_literals;
  GpuProbe p;
  p.run = run_process({trainer, "--backend", "nccl", "--hidden", "16", "--layers", "1", "--steps",
                       "3", "--log_every", "1"},
                      {{"DDP_BACKEND", "\x01"}}, 120s);
  const std::string& err = p.run.err;
  const bool flag_error = p.run.exited && p.run.code == 2;
  if (flag_error && err.find("has no GPU path") != std::string::npos) {
    p.reason = "train was built without its GPU path (CUDA Toolkit, cuBLAS or NCCL not found)";
    return p;
  }
  p.built = true;
  if (flag_error && err.find("no CUDA device is visible") != std::string::npos) {
    p.reason = "no GPU visible: " + err.substr(0, err.find('\n'));
    return p;
  }
  // The set-up line: "... | math on cuda:0 (NAME), cuBLAS; N CUDA device(s) visible".
  const auto at = p.run.out.find(" CUDA device(s) visible");
  if (p.run.exited && p.run.code == 0 && at != std::string::npos) {
    const auto start = p.run.out.rfind(' ', at - 1) + 1;
    p.gpus = std::stoi(p.run.out.substr(start, at - start));
    return p;
  }
  p.reason = kGpuProbeFailed;
  return p;
}

}  // namespace

const GpuProbe& train_gpu_probe(const std::string& trainer) {
  static std::mutex mutex;
  static std::map<std::string, GpuProbe> probes;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = probes.find(trainer);
  if (it == probes.end()) it = probes.emplace(trainer, probe(trainer)).first;
  return it->second;
}

}  // namespace ddp::testing
