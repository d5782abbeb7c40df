#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "ddp/common/error.h"
#include "ddp/ddp.h"

namespace ddp {

int node_cpus() {
  if (const char* text = std::getenv("DDP_NODE_CPUS"); text != nullptr && *text != '\0') {
    char* end = nullptr;
    const long n = std::strtol(text, &end, 10);
    if (end == text || *end != '\0' || n < 1 || n > 1 << 20) {
      throw Error("environment variable DDP_NODE_CPUS='" + std::string(text) +
                  "' is not a whole number >= 1");
    }
    return static_cast<int>(n);
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace ddp
