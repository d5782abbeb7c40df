#pragma once
// The NCCL unique-id exchange (internal; testable without a GPU, since
// ncclGetUniqueId needs none): rank 0 creates the id and Sets it under
// "nccl_unique_id" in the group's store (already scoped by run id, round and
// group); every other rank Gets it, waiting up to `timeout`.

#include <chrono>
#include <string>

#include "ddp/store.h"

namespace ddp {

// Whether this build has NCCL.
bool nccl_available();
// The id's bytes (NCCL_UNIQUE_ID_BYTES). Throws ddp::Error with NCCL's error
// string, or naming the key on timeout.
std::string exchange_nccl_unique_id(Store& store, int rank, std::chrono::milliseconds timeout);

}  // namespace ddp
