#pragma once
// The rendezvous limits both fuzz targets use: small enough that a few
// inputs reach every limit (the key and value sizes, the number of keys, the
// store's bytes, a round's world size, open barriers, held requests).

#include "rendezvous/limits.h"

namespace ddp::launcher {

inline RendezvousLimits small_fuzz_limits() {
  RendezvousLimits limits;
  limits.max_key_bytes = 24;  // room for the heal keys (ddprun/heal/relaunches)
  limits.max_value_bytes = 64;
  limits.max_keys = 6;
  limits.max_store_bytes = 200;
  limits.max_world_size = 12;
  limits.max_open_barriers = 3;
  limits.max_pending_waits = 6;
  return limits;
}

}  // namespace ddp::launcher
