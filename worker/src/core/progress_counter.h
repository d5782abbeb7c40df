#pragma once
// Counts this process's collectives and steps on ddprun's progress board, when ddprun
// gave one (DDP_PROGRESS_FD): the slot of this rank's
// LOCAL_RANK. Without a board both calls do nothing. Thread-safe.

namespace ddp::detail {

// `name`: the collective's name ("all_reduce", ...).
void collective_begun(const char* name);
void collective_ended();
// A training step ended (a synchronising GradSync or SharedGradSum finish):
// counted, and timed from the previous one, in the rank's step slot.
void step_finished();

}  // namespace ddp::detail
