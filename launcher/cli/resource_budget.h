#pragma once
// Whether this machine's limits let ddprun start N workers, checked before
// anything starts: every worker costs the supervisor open descriptors (its
// output pipes, its log files) and the user a process.

#include <sys/resource.h>

#include <string>

namespace ddp::launcher {

struct ResourceNeeds {
  long descriptors = 0;  // open files the supervisor holds at once
  long processes = 0;    // processes the workers add
};

// What `nproc` local workers need (`log_files`: each also has log files).
ResourceNeeds resource_needs(int nproc, bool log_files);

// Why `needs` does not fit the limits ("" when it does): how many are
// needed, the limit, and how to raise it. `root`: RLIMIT_NPROC does not
// apply. Pure.
std::string budget_problem(const ResourceNeeds& needs, const rlimit& files, const rlimit& procs,
                           bool root);

// Raises this process's soft RLIMIT_NOFILE towards its hard limit when the
// workers need more (as Python's resource users and MPI launchers do), then
// throws ddp::Error naming --nproc_per_node when they still do not fit.
void ensure_resources(int nproc, bool log_files);

}  // namespace ddp::launcher
