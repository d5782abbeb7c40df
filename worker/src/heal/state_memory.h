#pragma once
// What libddp knows of a process's carried state memory
// (Healer::state_memory()), and the state transfer that reads it straight
// from the donor's file (internal to libddp).

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "ddp/heal.h"
#include "ddp/params.h"
#include "ddp/process_group.h"

namespace ddp::detail {

// Where [p, p + bytes) lies in this process's carried state memory: the
// file's name (shm_open's form) and the offset in it; nullopt when it does
// not lie there whole (no carried block, private memory, another block).
struct StatePlace {
  std::string file;
  std::size_t offset = 0;
};
std::optional<StatePlace> state_memory_place(const void* p, std::size_t bytes);

// Readies [p, p + bytes), a mapping of a state memory file inherited from a
// dead predecessor: maps its pages, and zeroes them when `fill` says so.
void ready_inherited(char* p, std::size_t bytes, Healer::StateFill fill);

// A collective of `group` that moves the root's `state` to every member:
// when every member is on the node of `root` and buffers of the root's lie
// in its carried state memory, each other member reads the root's file and
// copies those buffers straight into its own (one copy, no chunked hand-over
// through a segment), the root waiting until all have, and the rest are
// broadcast. Returns false, having moved nothing, when no buffer can be
// copied so (then broadcast them all as usual); throws what the group's
// collectives throw (a member died).
bool copy_state_directly(ProcessGroup& group, int root, const std::vector<ParamBuffer>& state);

}  // namespace ddp::detail
