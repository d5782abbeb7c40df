#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "agent/rpc_plugin.h"
#include "ddp/common/error.h"

namespace ddp::launcher {
namespace {

std::string plugin_path() {
  if (const char* explicit_path = std::getenv("DDPRUN_RPC_PLUGIN");
      explicit_path && *explicit_path) {
    return explicit_path;
  }
  char exe[PATH_MAX] = {};
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  std::string dir = n > 0 ? std::string(exe, static_cast<size_t>(n)) : std::string(".");
  dir = dir.substr(0, dir.rfind('/'));
  // The build tree keeps it beside ddprun; an installed ddprun in libexec/ddprun/.
  const std::string beside = dir + "/libddprun_rpc.so";
#ifdef DDP_RPC_PLUGIN_INSTALL_DIR
  const std::string installed = dir + "/" DDP_RPC_PLUGIN_INSTALL_DIR "/libddprun_rpc.so";
  if (access(beside.c_str(), F_OK) != 0 && access(installed.c_str(), F_OK) == 0) return installed;
#endif
  return beside;
}

}  // namespace

std::string rpc_plugin_missing() {
  const std::string path = plugin_path();
  if (::access(path.c_str(), R_OK) == 0) return {};
  return "the rendezvous plugin " + path + " is missing or unreadable: " + std::strerror(errno);
}

RpcPlugin& load_rpc_plugin() {
  static std::once_flag once;
  static RpcPlugin* plugin = nullptr;
  static std::string error;
  std::call_once(once, [] {
    std::string path = plugin_path();
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      error = "cannot load the rendezvous plugin " + path + ": " + dlerror();
      return;
    }
    auto entry = reinterpret_cast<RpcPlugin* (*)()>(dlsym(handle, "ddprun_rpc_plugin"));
    if (entry == nullptr) {
      error = "rendezvous plugin " + path + " has no ddprun_rpc_plugin entry";
      return;
    }
    plugin = entry();
  });
  if (plugin == nullptr) throw Error(error);
  return *plugin;
}

}  // namespace ddp::launcher
