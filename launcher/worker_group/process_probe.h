#pragma once
// What ddprun can learn about a running worker from outside it, for hang
// reports (--hang_timeout) and for the workers' leftovers: how much CPU time its process group has
// used, whether it is stopped, its threads' native stacks, and which orphans ddprun adopted. Linux
// /proc and the stack tools Debian ships (elfutils' eu-stack, gdb).

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp::launcher {

struct GroupUsage {
  std::uint64_t cpu_ticks =
      0;  // user + system time of every process in the group, and of its reaped children
  bool leader_stopped = false;  // the group leader (the worker) is in the stopped state
};

// One scan of /proc: the usage of each group in `pgids` (same order). A
// group that is gone reads as zero.
std::vector<GroupUsage> process_group_usage(const std::vector<pid_t>& pgids);

// This process's children other than `known` (the workers, the orphan
// guard): the orphaned descendants it adopted as a subreaper.
std::vector<pid_t> adopted_children(const std::vector<pid_t>& known);

// The native stacks of every thread of `pid`, one line per frame, from
// eu-stack or, when it is missing, gdb in batch mode. Gives up after
// `timeout`, or as soon as a request to stop ddprun is pending; then, or when
// neither tool is installed or allowed to attach, the result is one line
// saying why.
std::vector<std::string> native_stacks(pid_t pid, std::chrono::milliseconds timeout);

}  // namespace ddp::launcher
