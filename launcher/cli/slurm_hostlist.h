#pragma once
// Slurm's hostlist syntax (SLURM_JOB_NODELIST, SLURM_STEP_NODELIST):
// comma-separated host expressions, each with any number of bracketed range
// groups: "gpu[01-04,07],login1", "rack[1-2]-n[1-3]" (every combination, in
// order), "n[009-011]" (zero padding kept: the width of the lower bound).
// Pure; throws ddp::Error naming the list and what is wrong.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::launcher {

// Every host, in Slurm's order (which is node id order). `limit` bounds the
// expansion (a typo like "n[1-999999999]" is an error, not an allocation).
std::vector<std::string> expand_hostlist(std::string_view list, std::size_t limit = 1 << 20);

// The first host only (node 0), without expanding the rest.
std::string first_host(std::string_view list);

}  // namespace ddp::launcher
