#include "cli/resource_budget.h"

#include <unistd.h>

#include <fstream>

#include "ddp/common/error.h"

namespace ddp::launcher {
namespace {

// The supervisor's own descriptors (gRPC, signalfd, the progress board,
// logs), with room to spare.
constexpr long kBaseDescriptors = 32;

std::string limit_text(rlim_t limit) {
  return limit == RLIM_INFINITY ? std::string("unlimited") : std::to_string(limit);
}

}  // namespace

ResourceNeeds resource_needs(int nproc, bool log_files) {
  const long per_worker = 2 + (log_files ? 2 : 0);  // stdout and stderr pipes (and files)
  return {kBaseDescriptors + per_worker * nproc, static_cast<long>(nproc)};
}

std::string budget_problem(const ResourceNeeds& needs, const rlimit& files, const rlimit& procs,
                           bool root) {
  if (files.rlim_cur != RLIM_INFINITY && static_cast<rlim_t>(needs.descriptors) > files.rlim_cur) {
    return std::to_string(needs.descriptors) + " open files are needed, the limit is " +
           limit_text(files.rlim_cur) + " (hard limit " + limit_text(files.rlim_max) +
           "; raise it with `ulimit -n " + std::to_string(needs.descriptors) +
           "` or in /etc/security/limits.conf)";
  }
  if (!root && procs.rlim_cur != RLIM_INFINITY &&
      static_cast<rlim_t>(needs.processes) > procs.rlim_cur) {
    return std::to_string(needs.processes) + " processes are needed, the limit is " +
           limit_text(procs.rlim_cur) + " for this user (raise it with `ulimit -u " +
           std::to_string(needs.processes) + "`)";
  }
  return "";
}

void ensure_resources(int nproc, bool log_files) {
  const ResourceNeeds needs = resource_needs(nproc, log_files);
  rlimit files{}, procs{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0 || getrlimit(RLIMIT_NPROC, &procs) != 0) return;
  if (files.rlim_cur != RLIM_INFINITY && static_cast<rlim_t>(needs.descriptors) > files.rlim_cur) {
    rlimit raised = files;
    raised.rlim_cur =
        files.rlim_max == RLIM_INFINITY
            ? static_cast<rlim_t>(needs.descriptors)
            : std::min<rlim_t>(files.rlim_max, static_cast<rlim_t>(needs.descriptors));
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) files = raised;
  }
  std::string why = budget_problem(needs, files, procs, geteuid() == 0);
  // Root has no process limit: the kernel's process ids are the bound.
  long pid_max = 0;
  if (std::ifstream("/proc/sys/kernel/pid_max") >> pid_max;
      why.empty() && pid_max > 0 && needs.processes > pid_max / 2) {
    why = std::to_string(needs.processes) + " processes are more than half of the kernel's " +
          std::to_string(pid_max) + " process ids (/proc/sys/kernel/pid_max)";
  }
  if (!why.empty()) {
    throw Error("--nproc_per_node=" + std::to_string(nproc) + ": too many workers for this " +
                "machine's limits: " + why);
  }
}

}  // namespace ddp::launcher
