#pragma once
// --bind_cores_to_rank (as DeepSpeed's launcher calls it): which CPUs each
// local rank may run on. Pure: the caller reads ddprun's own affinity mask
// and applies the result to each worker (spawn_process).

#include <vector>

namespace ddp::launcher {

// Splits `allowed` (CPU ids, in order, no repeats) among `local_ranks` ranks.
// With at least one CPU per rank, rank i gets a contiguous slice, the slices
// differing by at most one CPU (the first ranks get the remainder), so every
// CPU is used and none is shared. With fewer CPUs than ranks (oversubscribed),
// rank i gets the single CPU allowed[i % allowed.size()], so that every CPU
// carries as many ranks as any other, give or take one: the scheduler can
// no longer crowd three ranks on one core and one on the other, which made
// the shm collectives' latency bimodal (docs/PERFORMANCE.md).
// Throws ddp::Error when `allowed` is empty or local_ranks < 1.
std::vector<std::vector<int>> cpu_slices(const std::vector<int>& allowed, int local_ranks);

// The CPUs this process may run on (its affinity mask), in ascending order.
std::vector<int> allowed_cpus();

}  // namespace ddp::launcher
