#pragma once
// How the "ddp" backend forms its libddp groups: the group's ranks meet
// through torch's store, tell each other which node they run on, and agree
// on the transport (shared memory within a node and Gloo across nodes when
// some node holds several of the group's ranks in a row; Gloo otherwise).

#include <memory>
#include <string>

#include "backend.h"
#include "ddp/process_group.h"
#include "ddp/store.h"

namespace ddprun_torch {

// The group for CPU tensors. Collective over setup's ranks; throws ddp::Error
// naming the ranks missing when some never arrive within setup.timeout.
std::shared_ptr<ddp::ProcessGroup> make_cpu_group(const BackendSetup& setup,
                                                  const std::shared_ptr<ddp::Store>& store);
// The group for CUDA tensors on `device` (libddp's "nccl"), through the same
// store under its own prefix. Collective, as make_cpu_group.
std::shared_ptr<ddp::ProcessGroup> make_cuda_group(const BackendSetup& setup,
                                                   const std::shared_ptr<ddp::Store>& store,
                                                   int device);

}  // namespace ddprun_torch
