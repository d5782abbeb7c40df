#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "ddp/common/env_contract.h"
#include "ddp/common/error.h"
#include "ddp/ddp.h"

namespace ddp {

int node_cpus() {
  const int told = WorkerEnv::node_cpus_from([](const char* name) { return std::getenv(name); });
  if (told > 0) return told;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace ddp
