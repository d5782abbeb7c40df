#pragma once
// Reading a process's /proc/<pid>/stat without allocating, for code that may
// run in a forked child of a multi-threaded process (ddprun's orphan guard).

#include <sys/types.h>

namespace ddp {

// Reads `dir`/stat relative to `proc` (an open /proc directory and a pid's
// decimal name, or AT_FDCWD and "/proc/<pid>"; `dir` at most 40 characters)
// into `buf` and returns where its fields after "(comm) " start: the state
// letter, then " ppid pgrp ...". nullptr when it cannot be read (the process
// is gone, or /proc is not there; errno says which) or is malformed (errno
// EINVAL).
const char* read_proc_stat(int proc, const char* dir, char (&buf)[512]);

// read_proc_stat() of "/proc/<pid>" (pid > 0).
const char* read_proc_stat(pid_t pid, char (&buf)[512]);

// Whether a state letter from read_proc_stat() is a process that has exited
// (a zombie or dead one), which can do nothing more.
inline bool proc_state_exited(char state) { return state == 'Z' || state == 'X' || state == 'x'; }

// Whether process `pid` has exited (gone, or a zombie: it can do nothing
// more, and nothing may reap it for a long while), as far as this process can
// see: kill(2) and the /proc state. Where /proc cannot be read, kill(2)'s
// word stands; a malformed entry counts as running (nothing says otherwise).
// No allocation; safe in a forked child.
bool process_exited(pid_t pid);

}  // namespace ddp
