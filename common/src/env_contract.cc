#include "ddp/common/env_contract.h"

#include <cstdlib>
#include <limits>

#include "ddp/common/error.h"

namespace ddp {
namespace {

long parse_integer(const char* name, const char* text, long min, long max) {
  std::string s = text;
  if (s.empty()) throw Error("environment variable " + std::string(name) + " is empty");
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(s.c_str(), &end, 10);
  if (errno != 0 || end == s.c_str() || *end != '\0') {
    throw Error("environment variable " + std::string(name) + "='" + s + "' is not an integer");
  }
  if (value < min || value > max) {
    throw Error("environment variable " + std::string(name) + "=" + s + " is out of range [" +
                std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  return value;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> WorkerEnv::to_env() const {
  std::vector<std::pair<std::string, std::string>> env = {
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"GROUP_RANK", std::to_string(group_rank)},
      {"ROLE_RANK", std::to_string(role_rank)},
      {"WORLD_SIZE", std::to_string(world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(local_world_size)},
      {"GROUP_WORLD_SIZE", std::to_string(group_world_size)},
      {"ROLE_WORLD_SIZE", std::to_string(role_world_size)},
      {"ROLE_NAME", role_name},
      {"MASTER_ADDR", master_addr},
      {"MASTER_PORT", std::to_string(master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(max_restarts)},
      {"TORCHELASTIC_RUN_ID", run_id},
      {"DDP_RUN_ID", run_id},
      {"TORCHELASTIC_USE_AGENT_STORE", use_agent_store ? "True" : "False"},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", nccl_async_error_handling},
  };
  if (!error_file.empty()) env.emplace_back("TORCHELASTIC_ERROR_FILE", error_file);
  if (output_prefixed) env.emplace_back("DDP_OUTPUT_PREFIXED", "1");
  if (node_cpus > 0) env.emplace_back("DDP_NODE_CPUS", std::to_string(node_cpus));
  if (progress_fd >= 0) env.emplace_back("DDP_PROGRESS_FD", std::to_string(progress_fd));
  if (!omp_num_threads.empty()) env.emplace_back("OMP_NUM_THREADS", omp_num_threads);
  if (!python_fault_handler.empty()) env.emplace_back("PYTHONFAULTHANDLER", python_fault_handler);
  if (!cuda_visible_devices.empty()) env.emplace_back("CUDA_VISIBLE_DEVICES", cuda_visible_devices);
  if (!hip_visible_devices.empty()) env.emplace_back("HIP_VISIBLE_DEVICES", hip_visible_devices);
  if (heal) {
    env.emplace_back("DDP_ON_FAILURE", "heal");
    env.emplace_back("DDP_HEAL_MARK", heal_mark);
    env.emplace_back("DDP_INCARNATION", std::to_string(incarnation));
  }
  if (!rdzv_endpoint.empty()) {
    env.emplace_back("DDP_RDZV_ENDPOINT", rdzv_endpoint);
    env.emplace_back("DDP_RDZV_TOKEN", rdzv_token);
    env.emplace_back("DDP_ROUND", std::to_string(round));
    if (!rdzv_tls_ca.empty()) env.emplace_back("DDP_RDZV_TLS_CA", rdzv_tls_ca);
    if (!node_addr.empty()) env.emplace_back("DDP_NODE_ADDR", node_addr);
  } else if (!rdzv_unavailable.empty()) {
    env.emplace_back("DDP_RDZV_UNAVAILABLE", rdzv_unavailable);
  }
  return env;
}

const std::vector<std::string>& contract_variable_names() {
  static const std::vector<std::string> names = {"RANK",
                                                 "LOCAL_RANK",
                                                 "GROUP_RANK",
                                                 "ROLE_RANK",
                                                 "WORLD_SIZE",
                                                 "LOCAL_WORLD_SIZE",
                                                 "GROUP_WORLD_SIZE",
                                                 "ROLE_WORLD_SIZE",
                                                 "ROLE_NAME",
                                                 "MASTER_ADDR",
                                                 "MASTER_PORT",
                                                 "TORCHELASTIC_RESTART_COUNT",
                                                 "TORCHELASTIC_MAX_RESTARTS",
                                                 "TORCHELASTIC_RUN_ID",
                                                 "DDP_RUN_ID",
                                                 "DDP_RDZV_ENDPOINT",
                                                 "DDP_RDZV_TOKEN",
                                                 "DDP_ROUND",
                                                 "DDP_RDZV_TLS_CA",
                                                 "DDP_NODE_ADDR",
                                                 "DDP_OUTPUT_PREFIXED",
                                                 "DDP_RDZV_UNAVAILABLE",
                                                 "TORCHELASTIC_USE_AGENT_STORE",
                                                 "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                                                 "TORCHELASTIC_ERROR_FILE",
                                                 "DDP_ON_FAILURE",
                                                 "DDP_HEAL_MARK",
                                                 "DDP_INCARNATION",
                                                 "DDP_NODE_CPUS",
                                                 "DDP_PROGRESS_FD"};
  return names;
}

std::pair<std::string, std::string> visible_devices_variable(const std::vector<int>& devices) {
  std::string list;
  for (int d : devices) list += (list.empty() ? "" : ",") + std::to_string(d);
  return {"CUDA_VISIBLE_DEVICES", list};
}

std::optional<WorkerEnv> WorkerEnv::from_env(
    const std::function<const char*(const char*)>& getenv) {
  const char* rank_text = getenv("RANK");
  const char* world_text = getenv("WORLD_SIZE");
  if (rank_text == nullptr && world_text == nullptr) return std::nullopt;
  if (rank_text == nullptr) throw Error("environment variable RANK is missing (WORLD_SIZE is set)");
  if (world_text == nullptr)
    throw Error("environment variable WORLD_SIZE is missing (RANK is set)");

  constexpr long kMaxInt = std::numeric_limits<int>::max();
  WorkerEnv env;
  env.world_size = static_cast<int>(parse_integer("WORLD_SIZE", world_text, 1, kMaxInt));
  env.rank = static_cast<int>(parse_integer("RANK", rank_text, 0, env.world_size - 1));

  // Optional integers default to the single-node values implied by RANK/WORLD_SIZE.
  auto optional_int = [&](const char* name, long fallback, long min, long max) {
    const char* text = getenv(name);
    return text == nullptr ? static_cast<int>(fallback)
                           : static_cast<int>(parse_integer(name, text, min, max));
  };
  auto optional_str = [&](const char* name, const std::string& fallback) {
    const char* text = getenv(name);
    return text == nullptr ? fallback : std::string(text);
  };
  env.local_world_size = optional_int("LOCAL_WORLD_SIZE", env.world_size, 1, env.world_size);
  env.local_rank = optional_int("LOCAL_RANK", env.rank, 0, env.local_world_size - 1);
  env.group_world_size = optional_int("GROUP_WORLD_SIZE", 1, 1, env.world_size);
  env.group_rank = optional_int("GROUP_RANK", 0, 0, env.group_world_size - 1);
  env.role_world_size = optional_int("ROLE_WORLD_SIZE", env.world_size, 1, kMaxInt);
  env.role_rank = optional_int("ROLE_RANK", env.rank, 0, env.role_world_size - 1);
  env.role_name = optional_str("ROLE_NAME", "default");
  env.master_addr = optional_str("MASTER_ADDR", "127.0.0.1");
  env.master_port = optional_int("MASTER_PORT", 0, 0, 65535);
  env.restart_count = optional_int("TORCHELASTIC_RESTART_COUNT", 0, 0, kMaxInt);
  env.max_restarts = optional_int("TORCHELASTIC_MAX_RESTARTS", 0, 0, kMaxInt);
  env.run_id = optional_str("DDP_RUN_ID", optional_str("TORCHELASTIC_RUN_ID", ""));
  env.rdzv_endpoint = optional_str("DDP_RDZV_ENDPOINT", "");
  env.rdzv_unavailable = optional_str("DDP_RDZV_UNAVAILABLE", "");
  env.rdzv_token = optional_str("DDP_RDZV_TOKEN", "");
  env.rdzv_tls_ca = optional_str("DDP_RDZV_TLS_CA", "");
  env.node_addr = optional_str("DDP_NODE_ADDR", "");
  env.output_prefixed = optional_int("DDP_OUTPUT_PREFIXED", 0, 0, 1) == 1;
  env.error_file = optional_str("TORCHELASTIC_ERROR_FILE", "");
  env.nccl_async_error_handling = optional_str("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  env.use_agent_store =
      optional_str("TORCHELASTIC_USE_AGENT_STORE", "False") == "True";  // torch's test
  const std::string on_failure = optional_str("DDP_ON_FAILURE", "restart");
  if (on_failure != "restart" && on_failure != "heal") {
    throw Error("environment variable DDP_ON_FAILURE='" + on_failure +
                "' is not one of restart, heal");
  }
  env.heal = on_failure == "heal";
  env.heal_mark = optional_str("DDP_HEAL_MARK", "");
  env.incarnation = optional_int("DDP_INCARNATION", 0, 0, kMaxInt);
  env.node_cpus = node_cpus_from(getenv);
  env.progress_fd = optional_int("DDP_PROGRESS_FD", -1, 0, 1 << 20);
  env.omp_num_threads = optional_str("OMP_NUM_THREADS", "");
  env.python_fault_handler = optional_str("PYTHONFAULTHANDLER", "");
  const char* round_text = getenv("DDP_ROUND");
  env.round = round_text == nullptr ? 0 : parse_integer("DDP_ROUND", round_text, 0, kMaxInt);
  return env;
}

int WorkerEnv::node_cpus_from(const std::function<const char*(const char*)>& getenv) {
  const char* text = getenv("DDP_NODE_CPUS");
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const long n = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || n < 1 || n > 1 << 20) {
    throw Error("environment variable DDP_NODE_CPUS='" + std::string(text) +
                "' is not a whole number >= 1");
  }
  return static_cast<int>(n);
}

std::optional<WorkerEnv> WorkerEnv::from_process_env() {
  return from_env([](const char* name) { return std::getenv(name); });
}

}  // namespace ddp
