// The demo worker: prints its part of the environment contract, passes a
// barrier with every other rank over MASTER_ADDR:MASTER_PORT, and exits.

#include <cstdio>

#include "ddp/common/env_contract.h"
#include "ddp/common/error.h"
#include "tcp_barrier.h"

int main() {
  try {
    auto env = ddp::WorkerEnv::from_process_env();
    if (!env) {
      std::printf("not launched by ddprun: a world of one\n");
      return 0;
    }
    std::printf("hello from rank %d of %d (local rank %d, node %d), master %s:%d, run %s, attempt %d\n",
                env->rank, env->world_size, env->local_rank, env->group_rank, env->master_addr.c_str(),
                env->master_port, env->run_id.c_str(), env->restart_count);
    std::fflush(stdout);
    ddp::examples::tcp_barrier(*env, 30000);
    std::printf("rank %d passed the barrier with %d ranks\n", env->rank, env->world_size);
    return 0;
  } catch (const ddp::Error& e) {
    std::fprintf(stderr, "hello_worker: %s\n", e.what());
    return 1;
  }
}
