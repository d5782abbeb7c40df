// The smallest libddp program: run it under ddprun
// (`ddprun --nproc_per_node=4 build/examples/hello_worker`). It joins
// the job's process group, passes a barrier with every other rank, sums the
// ranks with an all-reduce and checks the result.

#include <cstdio>

#include "ddp/ddp.h"

int main() {
  try {
    auto group =
        ddp::init();  // the backend ddprun's environment implies; a world of one without ddprun
    std::printf("hello from rank %d of %d (local rank %d of %d)\n", ddp::rank(), ddp::world_size(),
                ddp::local_rank(), ddp::local_world_size());
    std::fflush(stdout);
    group->barrier();
    long long sum = ddp::rank();
    group->all_reduce(&sum, 1, ddp::DType::kInt64, ddp::ReduceOp::kSum);
    const long long n = ddp::world_size();
    if (sum != n * (n - 1) / 2) {
      std::fprintf(stderr, "hello_worker: the ranks summed to %lld, expected %lld\n", sum,
                   n * (n - 1) / 2);
      return 1;
    }
    std::printf("rank %d passed the barrier; the ranks sum to %lld\n", ddp::rank(), sum);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hello_worker: %s\n", e.what());
    return 1;
  }
}
