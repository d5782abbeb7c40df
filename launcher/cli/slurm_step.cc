#include "cli/slurm_step.h"

#include <charconv>
#include <cstdint>

#include "cli/slurm_hostlist.h"
#include "ddp/common/error.h"

namespace ddp::launcher {
namespace {

std::optional<std::string> value_of(const std::function<const char*(const char*)>& getenv,
                                    const char* name) {
  const char* v = getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

int parse_count(const std::string& var, const std::string& text, int min) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < min) {
    throw Error(var + "=" + text + ": expected an integer >= " + std::to_string(min) +
                " (set by Slurm's srun)");
  }
  return value;
}

// The first of `names` that is set, with its name.
std::optional<std::pair<std::string, std::string>> first_set(
    const std::function<const char*(const char*)>& getenv,
    std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (auto v = value_of(getenv, name)) return std::make_pair(std::string(name), *v);
  }
  return std::nullopt;
}

}  // namespace

std::string SlurmStep::run_id() const { return "slurm-" + job_id + "." + step_id; }

int SlurmStep::master_port() const {
  // FNV-1a of "job.step": the same on every node, spread over the range.
  std::uint32_t h = 2166136261u;
  for (char c : job_id + "." + step_id) {
    h ^= static_cast<unsigned char>(c);
    h *= 16777619u;
  }
  return 10000 + 2 * static_cast<int>(h % 5000);
}

int tasks_on_node(const std::string& text, int node_id) {
  const std::string var = "SLURM_STEP_TASKS_PER_NODE";
  int node = 0;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = text.find(',', start);
    std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    int repeat = 1;
    if (auto paren = item.find("(x"); paren != std::string::npos) {
      if (item.back() != ')') throw Error(var + "=" + text + ": '" + item + "' is not N or N(xM)");
      repeat = parse_count(var, item.substr(paren + 2, item.size() - paren - 3), 1);
      item = item.substr(0, paren);
    }
    int tasks = parse_count(var, item, 0);
    if (node_id < node + repeat) return tasks;
    node += repeat;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  throw Error(var + "=" + text + " lists " + std::to_string(node) +
              " node(s); SLURM_NODEID=" + std::to_string(node_id) + " is not among them");
}

std::optional<SlurmStep> read_slurm_step(const std::function<const char*(const char*)>& getenv) {
  auto job = value_of(getenv, "SLURM_JOB_ID");
  auto step = value_of(getenv, "SLURM_STEP_ID");
  if (!job || !step) return std::nullopt;
  SlurmStep s;
  s.job_id = *job;
  s.step_id = *step;
  auto nodes = first_set(getenv, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES"});
  if (!nodes)
    throw Error("SLURM_STEP_ID is set but neither SLURM_STEP_NUM_NODES nor SLURM_NNODES is");
  s.num_nodes_var = nodes->first;
  s.num_nodes = parse_count(nodes->first, nodes->second, 1);
  auto node_id = value_of(getenv, "SLURM_NODEID");
  if (!node_id) throw Error("SLURM_STEP_ID is set but SLURM_NODEID is not");
  s.node_id = parse_count("SLURM_NODEID", *node_id, 0);
  if (s.node_id >= s.num_nodes) {
    throw Error("SLURM_NODEID=" + *node_id + " is not below " + s.num_nodes_var + "=" +
                nodes->second + ": this task is outside its own step");
  }
  auto list = first_set(getenv, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  if (!list)
    throw Error("SLURM_STEP_ID is set but SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST) is not");
  s.nodelist_var = list->first;
  s.nodelist = list->second;
  s.first_host = first_host(s.nodelist);
  if (auto per_node = first_set(getenv, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})) {
    s.tasks_on_this_node = tasks_on_node(per_node->second, s.node_id);
    if (s.tasks_on_this_node > 1) {
      throw Error(
          per_node->first + "=" + per_node->second + ": srun started " +
          std::to_string(s.tasks_on_this_node) +
          " ddprun tasks on this node (SLURM_NODEID=" + *node_id +
          "), which would each start a job of their own; ddprun is one task per node: run "
          "srun --ntasks-per-node=1 and give the workers per node with --nproc_per_node (or give "
          "--nnodes and --node_rank yourself)");
    }
  }
  if (auto gpus = first_set(getenv, {"SLURM_STEP_GPUS", "SLURM_JOB_GPUS"})) s.gpus = gpus->second;
  return s;
}

}  // namespace ddp::launcher
