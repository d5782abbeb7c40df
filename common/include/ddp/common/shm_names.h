#pragma once
// Names of the POSIX shared-memory segments of a run (libddp's shm backend),
// in one place so the worker that creates them and the launcher that removes
// them agree. A segment's name starts with the run's prefix, so ddprun can
// remove every segment of its run when it tears a job down, whatever killed
// the workers. Every pid and heir's rank in a name is followed by "i" and the
// PID namespace it is counted in (pid_namespace_id(); left out where that is
// not known), so a sweep leaves alone the files of another namespace that
// shares /dev/shm (a container run with the host's IPC namespace), whose pids
// it cannot check.

#include <string>

namespace ddp {

// "ddp-<run id>-": the run id with '_' doubled and every other character
// outside [A-Za-z0-9.] written as '_' and two hex digits, so distinct ids get
// distinct prefixes and none is a prefix of another's; ids longer than 96
// characters (escaped) are shortened with a hash. No leading slash.
std::string shm_run_prefix(const std::string& run_id);

// The id of this process's PID namespace (the inode number of
// /proc/self/ns/pid); 0 where /proc cannot say.
unsigned long pid_namespace_id();

// The name of one segment, as shm_open takes it:
// "/ddp-<run>-r<round>-<group>-n<node>-p<pid>i<ns>-<unique>". `group` is
// sanitised like the run id; `pid` is the creating process's (as its
// launcher sees it: the sweep keeps the segments of running creators);
// `unique` is chosen by the creator (random hex).
std::string shm_segment_name(const std::string& run_id, long round, const std::string& group,
                             int node, long pid, const std::string& unique);

// The name of a process's carried shm arena (ProcessGroupOptions::shm_carry_arena):
// "/ddp-<run>-arena-p<pid>i<ns>-<unique>". Its pid is the process's as its
// launcher sees it, so ddprun can find the arena of a worker it saw die.
std::string shm_arena_name(const std::string& run_id, long pid, const std::string& unique);

// What every arena name of process `pid` of `run_id` starts with (no leading
// slash, as remove_segments_with_prefix() takes it).
std::string shm_arena_prefix(const std::string& run_id, long pid);

// The name a dead worker's carried arena is given for the process relaunched
// in its place (the same global rank), which takes it over:
// "/ddp-<run>-arena-heir-r<rank>i<ns>".
std::string shm_arena_heir_name(const std::string& run_id, int rank);

// The name of a process's state memory (ddp::Healer::state_memory):
// "/ddp-<run>-state-p<pid>i<ns>-<unique>", and the name it is given for the
// process relaunched in its place: "/ddp-<run>-state-heir-r<rank>i<ns>".
std::string shm_state_name(const std::string& run_id, long pid, const std::string& unique);
std::string shm_state_heir_name(const std::string& run_id, int rank);

// What every state-memory name of process `pid` of `run_id` starts with (no
// leading slash), as shm_arena_prefix() for arenas.
std::string shm_state_prefix(const std::string& run_id, long pid);

// Renames the carried arena and the state memory of process `pid` of
// `run_id` in `dir` (those it made) to their heir names for `rank`,
// replacing an heir's file nobody took over. Returns how many it renamed.
int pass_carried_memory_to_heir(const std::string& run_id, long pid, int rank,
                                const std::string& dir = "/dev/shm");

// Removes (unlinks) every segment of `run_id` found in `dir` (the tmpfs
// behind shm_open), but the segments, arenas and state memory made by
// processes still running (another ddprun of the run on this machine may use
// them; a zombie counts as gone) and every file named in another PID
// namespace (its own ddprun removes those). Returns
// how many were removed. Best effort, for teardown: an unreadable directory
// removes nothing and is not an error.
int remove_run_segments(const std::string& run_id, const std::string& dir = "/dev/shm");

// The same for every entry of `dir` whose name starts with `prefix` (a run's
// prefix: what running processes made is kept), without
// allocating (getdents64 + unlinkat), so a forked child of a multi-threaded
// process may call it (ddprun's orphan guard does).
int remove_segments_with_prefix(const char* dir, const char* prefix);

}  // namespace ddp
