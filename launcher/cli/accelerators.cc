#include "cli/accelerators.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace ddp::launcher {
namespace {

// Names in `dir` accepted by `keep`.
template <typename Keep>
int count_entries(const std::string& dir, Keep keep) {
  int count = 0;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* entry = readdir(d)) {
      if (keep(std::string(entry->d_name))) ++count;
    }
    closedir(d);
  }
  return count;
}

bool has_number_suffix(const std::string& name, const std::string& prefix) {
  return name.size() > prefix.size() && name.rfind(prefix, 0) == 0 &&
         name.find_first_not_of("0123456789", prefix.size()) == std::string::npos;
}

int count_nvidia_nodes(const DeviceProbe& probe) {
  return count_entries(probe.dev_root,
                       [](const std::string& n) { return has_number_suffix(n, "nvidia"); });
}

// ROCm's topology: one node per CPU socket and GPU; a GPU's gpu_id is non-zero.
int count_kfd_gpus(const DeviceProbe& probe) {
  if (access((probe.dev_root + "/kfd").c_str(), F_OK) != 0) return 0;
  const std::string nodes = probe.sys_root + "/class/kfd/kfd/topology/nodes";
  return count_entries(nodes, [&](const std::string& n) {
    if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos) return false;
    std::ifstream id(nodes + "/" + n + "/gpu_id");
    long long value = 0;
    return static_cast<bool>(id >> value) && value != 0;
  });
}

std::string driver_of(const std::string& device_dir) {
  char target[4096] = {};
  ssize_t n = readlink((device_dir + "/device/driver").c_str(), target, sizeof(target) - 1);
  if (n <= 0) return "";
  std::string path(target, static_cast<size_t>(n));
  return path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1);
}

}  // namespace

const char* DeviceProbe::env(const char* name) const {
  return getenv ? getenv(name) : std::getenv(name);
}

int count_visible_list(const std::string& list) {
  int count = 0;
  std::stringstream items(list);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty() || item[0] == '-') break;
    ++count;
  }
  return count;
}

int count_gpus(const DeviceProbe& probe) {
  const int nvidia = count_nvidia_nodes(probe);
  const char* cuda = probe.env("CUDA_VISIBLE_DEVICES");
  if (nvidia > 0 || (cuda != nullptr && access((probe.dev_root + "/kfd").c_str(), F_OK) != 0)) {
    return cuda != nullptr ? count_visible_list(cuda) : nvidia;
  }
  // HIP reads HIP_VISIBLE_DEVICES first, then CUDA_VISIBLE_DEVICES; ROCR's
  // list is applied below both.
  for (const char* name : {"HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"}) {
    if (const char* list = probe.env(name)) return count_visible_list(list);
  }
  return count_kfd_gpus(probe);
}

int count_xpus(const DeviceProbe& probe) {
  if (const char* mask = probe.env("ZE_AFFINITY_MASK")) return count_visible_list(mask);
  const std::string drm = probe.sys_root + "/class/drm";
  return count_entries(drm, [&](const std::string& n) {
    if (!has_number_suffix(n, "renderD")) return false;
    const std::string driver = driver_of(drm + "/" + n);
    return driver == "i915" || driver == "xe";
  });
}

}  // namespace ddp::launcher
