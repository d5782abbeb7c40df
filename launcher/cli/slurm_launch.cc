#include "cli/slurm_launch.h"

#include <cstdlib>
#include <optional>

#include "cli/slurm_step.h"
#include "ddp/common/error.h"

namespace ddp::launcher {

std::string SlurmTook::line(const LaunchSpec& spec) const {
  std::vector<std::string> took = before;
  if (rendezvous) {
    took.push_back("rendezvous at " + spec.rdzv_endpoint + " (" + nodelist + ", MASTER_PORT " +
                   std::to_string(spec.master_port) + ")");
  }
  took.insert(took.end(), after.begin(), after.end());
  std::string text = step + ": took ";
  for (std::size_t i = 0; i < took.size(); ++i) text += (i == 0 ? "" : ", ") + took[i];
  return text;
}

SlurmTook apply_slurm_step(LaunchSpec& spec, std::string& nnodes_text, std::string& run_id,
                           const GivenShape& given) {
  SlurmTook result;
  if (given.standalone || (given.nnodes && given.node_rank) || (given.nnodes && nnodes_text == "1"))
    return result;
  std::optional<SlurmStep> step =
      read_slurm_step([](const char* name) { return std::getenv(name); });
  if (!step) return result;
  const std::string nodes = std::to_string(step->num_nodes);
  if (given.nnodes) {
    const std::string min_text = nnodes_text.substr(0, nnodes_text.find(':'));
    if (parse_nnodes(nnodes_text).min > step->num_nodes) {
      throw Error("--nnodes=" + nnodes_text + " needs more nodes than this Slurm step has (" +
                  step->num_nodes_var + "=" + nodes + "): run srun -N" + min_text +
                  ", or leave --nnodes out to take the step's");
    }
  } else {
    nnodes_text = nodes;
  }
  if (!given.nnodes) result.before.push_back(nodes + " node(s) (" + step->num_nodes_var + ")");
  if (!given.node_rank && nnodes_text.find(':') == std::string::npos) {
    spec.node_rank = step->node_id;
    result.before.push_back("node rank " + std::to_string(step->node_id) + " (SLURM_NODEID)");
  }
  if (!given.endpoint && nnodes_text != "1") {
    if (!given.master_addr) spec.master_addr = step->first_host;
    if (!given.master_port) spec.master_port = step->master_port();
    result.rendezvous = true;
    result.nodelist = "first host of " + step->nodelist_var + "=" + step->nodelist;
  }
  if (!given.run_id) {
    run_id = step->run_id();
    result.after.push_back("run id " + run_id);
  }
  if (std::getenv("CUDA_VISIBLE_DEVICES") == nullptr && !step->gpus.empty()) {
    spec.cuda_visible_devices = step->gpus;
    result.after.push_back("CUDA_VISIBLE_DEVICES=" + step->gpus + " (SLURM_STEP_GPUS)");
  }
  if (nnodes_text == "1" && spec.cuda_visible_devices.empty())
    return result;  // a one-node step: nothing changed
  result.step = "Slurm job " + step->job_id + " step " + step->step_id;
  return result;
}

}  // namespace ddp::launcher
