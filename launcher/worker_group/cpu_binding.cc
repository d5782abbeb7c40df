#include "worker_group/cpu_binding.h"

#include <sched.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "ddp/common/error.h"

namespace ddp::launcher {

std::vector<std::vector<int>> cpu_slices(const std::vector<int>& allowed, int local_ranks) {
  if (allowed.empty()) throw Error("--bind_cores_to_rank: this process may run on no CPU");
  if (local_ranks < 1) {
    throw Error("--bind_cores_to_rank: " + std::to_string(local_ranks) + " local ranks");
  }
  const int cpus = static_cast<int>(allowed.size());
  std::vector<std::vector<int>> slices(static_cast<std::size_t>(local_ranks));
  if (cpus < local_ranks) {
    for (int r = 0; r < local_ranks; ++r) slices[r] = {allowed[static_cast<std::size_t>(r % cpus)]};
    return slices;
  }
  const int base = cpus / local_ranks, extra = cpus % local_ranks;
  int next = 0;
  for (int r = 0; r < local_ranks; ++r) {
    const int size = base + (r < extra ? 1 : 0);
    slices[r].assign(allowed.begin() + next, allowed.begin() + next + size);
    next += size;
  }
  return slices;
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) {
    throw Error(std::string("--bind_cores_to_rank: cannot read ddprun's CPU affinity: ") +
                std::strerror(errno));
  }
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

}  // namespace ddp::launcher
