#pragma once
// What a ddprun task learns from the Slurm job step it runs in (srun sets
// these variables in every task). Pure: reads through an injected getenv.
//
// A task of a step (SLURM_JOB_ID and SLURM_STEP_ID set) is one node of the
// job: the step's node count is --nnodes, SLURM_NODEID the node rank, the
// step's first host runs the rendezvous. A batch script or salloc shell
// (no SLURM_STEP_ID) is not a step: ddprun there is a single node unless
// told otherwise.

#include <functional>
#include <optional>
#include <string>

namespace ddp::launcher {

struct SlurmStep {
  std::string job_id;         // SLURM_JOB_ID
  std::string step_id;        // SLURM_STEP_ID
  int num_nodes = 1;          // SLURM_STEP_NUM_NODES, else SLURM_NNODES
  std::string num_nodes_var;  // which of the two it came from
  int node_id = 0;            // SLURM_NODEID: this node's index in the step
  std::string nodelist;       // SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST
  std::string nodelist_var;
  std::string first_host;      // node 0 of nodelist
  int tasks_on_this_node = 1;  // ddprun tasks srun started on this node
  std::string gpus;            // SLURM_STEP_GPUS, else SLURM_JOB_GPUS ("" when none)

  // "slurm-<job>.<step>": the same on every node of the step, distinct
  // between steps.
  std::string run_id() const;
  // A MASTER_PORT for the step in [10000, 19998], even, derived from the job
  // and step ids, so that jobs sharing a node rarely collide (with TLS or an
  // elastic size the rendezvous takes the port after it).
  int master_port() const;
};

// nullopt outside a job step. Throws ddp::Error naming the Slurm variable
// when a value is malformed, or when the step is not one ddprun task per
// node (SLURM_STEP_TASKS_PER_NODE) or SLURM_NODEID is outside the step.
std::optional<SlurmStep> read_slurm_step(const std::function<const char*(const char*)>& getenv);

// Tasks on node `node_id` from Slurm's tasks-per-node syntax "2(x3),1"
// (counts in node order, "(xN)" repeating one). Throws ddp::Error.
int tasks_on_node(const std::string& tasks_per_node, int node_id);

}  // namespace ddp::launcher
