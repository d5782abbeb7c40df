#pragma once
// How many accelerators of each kind this process may use, for
// --nproc_per_node=gpu|xpu|auto. Reads device nodes, sysfs and the
// visibility variables only (no driver is loaded), through a probe whose
// roots and getenv tests replace with fake trees.

#include <functional>
#include <string>

namespace ddp::launcher {

struct DeviceProbe {
  std::string dev_root = "/dev";
  std::string sys_root = "/sys";
  std::function<const char*(const char*)> getenv;  // empty: the process environment
  const char* env(const char* name) const;
};

// GPUs as torch.cuda counts them: NVIDIA (CUDA_VISIBLE_DEVICES, else
// /dev/nvidiaN) or, on a node without NVIDIA devices, AMD under ROCm
// (HIP_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES or CUDA_VISIBLE_DEVICES when
// set, else the GPU nodes of /sys/class/kfd/kfd/topology, needing /dev/kfd).
int count_gpus(const DeviceProbe& probe = {});

// Intel GPUs as torch.xpu counts them: ZE_AFFINITY_MASK when set, else the
// render nodes (/sys/class/drm/renderD*) driven by i915 or xe.
int count_xpus(const DeviceProbe& probe = {});

// A visibility list's entries up to the first invalid one, as the runtimes
// read it ("" or "-1" hides every device).
int count_visible_list(const std::string& list);

}  // namespace ddp::launcher
