#pragma once
// The Slurm side of parse_launch_args (internal to cli/): what a job step
// gives the launch that its command line does not (slurm_step.h reads the
// step).

#include <string>
#include <vector>

#include "cli/launch_spec.h"

namespace ddp::launcher {

// Which of the job's shape the command line, PET_* or the config file gave.
struct GivenShape {
  bool nnodes = false, node_rank = false, endpoint = false, master_addr = false,
       master_port = false, run_id = false, standalone = false;
};

// What a Slurm step gave: the line that says so, written once the
// rendezvous's endpoint is known (apply_backend derives it).
struct SlurmTook {
  bool rendezvous = false;                 // MASTER_ADDR and MASTER_PORT came from the step
  std::vector<std::string> before, after;  // what was taken, around the rendezvous
  std::string step, nodelist;              // "Slurm job J step S", "first host of VAR=LIST"
  bool any() const { return !step.empty(); }
  std::string line(const LaunchSpec& spec) const;
};

// Inside a Slurm job step, what the user did not give comes from the step:
// the node count, the node rank, the rendezvous on the step's first host and
// the run id; also the step's GPUs when CUDA_VISIBLE_DEVICES is unset.
// Explicit flags and PET_* win; a single node asked for explicitly
// (--nnodes=1, --standalone) ignores Slurm.
SlurmTook apply_slurm_step(LaunchSpec& spec, std::string& nnodes_text, std::string& run_id,
                           const GivenShape& given);

}  // namespace ddp::launcher
