#pragma once
// The optimizers of optimizer.h on a GPU (the GPU path): the same update
// rules, as kernels (device_kernels.h) on the Gpu's stream, with the
// per-parameter buffers in device memory.
//
// The state has optimizer.h's shape — the step count (1 int64) first, then
// the float buffers in parameter order — but lives on the device, so a
// checkpoint of either path loads into the other. The step count, which the
// host needs for Adam's bias correction, is mirrored in one device word:
// state() writes it there and reload_state() reads it back after someone
// (a broadcast, a checkpoint load) overwrote the buffers.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "cuda_util.h"
#include "ddp/params.h"
#include "flags.h"

namespace train {

class DeviceOptimizer {
 public:
  explicit DeviceOptimizer(const Gpu& gpu) : gpu_(gpu), steps_word_(1) {}
  virtual ~DeviceOptimizer() = default;
  DeviceOptimizer(const DeviceOptimizer&) = delete;
  DeviceOptimizer& operator=(const DeviceOptimizer&) = delete;

  void begin_step() { ++steps_; }
  // Enqueues this step's update of parameter `param` (data and grad: device
  // memory, count(param) elements).
  virtual void update(std::size_t param, float* data, const float* grad) = 0;
  // The whole state as device buffers (the step count first, copied to its
  // device word now). The pointers stay valid for the optimizer's lifetime.
  std::vector<ddp::ParamBuffer> state();
  // Reads the step count back from its device word.
  void reload_state();
  std::int64_t steps() const { return steps_; }

 protected:
  virtual std::vector<ddp::ParamBuffer> buffers() = 0;  // the float buffers, in order

  const Gpu& gpu_;
  std::int64_t steps_ = 0;

 private:
  DeviceArray<std::int64_t> steps_word_;
};

// counts[i]: parameter i's element count.
std::unique_ptr<DeviceOptimizer> make_device_optimizer(const Config& config,
                                                       const std::vector<std::size_t>& counts,
                                                       const Gpu& gpu);

}  // namespace train
