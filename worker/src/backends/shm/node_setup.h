#pragma once
// How the ranks of one node meet at their segment (internal to the shm
// backend): local rank 0 announces the segment in the group's store before
// it makes it, the others attach to what it announced, and each rank finds
// the arena it carries from earlier groups of its process.

#include <chrono>
#include <memory>
#include <string>

#include "backends/shm/carried_arena.h"
#include "backends/shm/segment.h"
#include "core/backend.h"

namespace ddp::shm {

// The segment local rank 0 published under `key` ("<identity> <name>", see
// core/process_identity.h), once it has made it; `me` of `local_size`,
// `first_rank` the group rank of local rank 0. If rank 0 dies first (and
// shares this process's PID namespace, so its death can be seen), its partly
// made segment is removed and the error names it; a creation that failed
// ("!" and rank 0's reason) is that reason. Throws ddp::Error past `deadline`.
std::unique_ptr<Segment> attach_published(Store& store, const std::string& key, int me,
                                          int local_size, int first_rank,
                                          std::chrono::milliseconds wait,
                                          std::chrono::steady_clock::time_point deadline);

// The run's name in shared-memory names: its id, or one of this process's
// own when the group has none (a standalone group).
std::string run_name(const BackendConfig& config);

// This process's carried arena of `bytes` (a relaunch's is its
// predecessor's, taken over once and said so), or nullptr when it has
// another size.
std::shared_ptr<CarriedArena> carried_arena_for(const BackendConfig& config, std::size_t bytes);

// Whether every node has as many ranks as this one (hierarchical all-reduce
// needs it); collective over the group, through its store.
bool same_local_size_on_every_node(const BackendConfig& config, std::chrono::milliseconds wait);

}  // namespace ddp::shm
