#pragma once
// Counts this process's collectives on ddprun's progress board, when ddprun
// gave one (DDP_PROGRESS_FD): the slot of this rank's
// LOCAL_RANK. Without a board both calls do nothing. Thread-safe.

namespace ddp::detail {

// `name`: the collective's name ("all_reduce", ...).
void collective_begun(const char* name);
void collective_ended();

}  // namespace ddp::detail
