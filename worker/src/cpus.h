#pragma once
// How many cores this process may run on (its affinity mask; the online CPUs
// when the mask cannot be read): what decides whether waiting ranks spin.

namespace ddp {

int cpus_available();

}  // namespace ddp
