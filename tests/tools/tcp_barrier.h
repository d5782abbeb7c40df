#pragma once
// A plain-socket barrier over MASTER_ADDR:MASTER_PORT, for test workers that
// do not use libddp: rank 0 binds MASTER_PORT (SO_REUSEADDR, as PyTorch's TCPStore
// does) and waits for world_size - 1 connections, then releases everyone.
// Shows that MASTER_PORT is free for the program. Throws ddp::Error on
// timeout, naming the ranks that never arrived.

#include "ddp/common/env_contract.h"

namespace ddp::testing {

void tcp_barrier(const WorkerEnv& env, int timeout_ms);

}  // namespace ddp::testing
