#include "ddp/common/env_contract.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <map>

#include "ddp/common/error.h"

namespace ddp {
namespace {

std::optional<WorkerEnv> parse(const std::map<std::string, std::string>& vars) {
  return WorkerEnv::from_env([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(EnvContract, WriterAndParserRoundTrip) {
  WorkerEnv env;
  env.rank = 5;
  env.local_rank = 1;
  env.group_rank = 2;
  env.role_rank = 5;
  env.world_size = 8;
  env.local_world_size = 2;
  env.group_world_size = 4;
  env.role_world_size = 8;
  env.role_name = "trainer";
  env.master_addr = "10.0.0.1";
  env.master_port = 29500;
  env.restart_count = 2;
  env.max_restarts = 3;
  env.run_id = "abc";
  env.rdzv_endpoint = "host:29400";
  env.rdzv_token = "tok";
  env.round = 4;
  env.rdzv_tls_ca = "/etc/ca.pem";
  env.node_addr = "10.0.0.2";
  env.output_prefixed = true;
  env.error_file = "/logs/attempt_0/1/error.json";
  env.nccl_async_error_handling = "0";
  env.heal = true;
  env.heal_mark = "/run/heal-mark-1";
  env.incarnation = 2;
  env.node_cpus = 6;
  env.progress_fd = 9;
  env.omp_num_threads = "1";
  env.python_fault_handler = "1";
  auto pairs = env.to_env();
  std::map<std::string, std::string> vars(pairs.begin(), pairs.end());
  for (const auto& name : contract_variable_names()) {
    // DDP_RDZV_UNAVAILABLE stands in for the endpoint when there is none.
    if (name != "DDP_RDZV_UNAVAILABLE") {
      EXPECT_TRUE(vars.count(name)) << name;
    }
  }
  EXPECT_FALSE(vars.count("DDP_RDZV_UNAVAILABLE"));
  auto back = parse(vars);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->rank, 5);
  EXPECT_EQ(back->local_rank, 1);
  EXPECT_EQ(back->group_rank, 2);
  EXPECT_EQ(back->world_size, 8);
  EXPECT_EQ(back->local_world_size, 2);
  EXPECT_EQ(back->group_world_size, 4);
  EXPECT_EQ(back->role_name, "trainer");
  EXPECT_EQ(back->master_addr, "10.0.0.1");
  EXPECT_EQ(back->master_port, 29500);
  EXPECT_EQ(back->restart_count, 2);
  EXPECT_EQ(back->max_restarts, 3);
  EXPECT_EQ(back->run_id, "abc");
  EXPECT_EQ(back->rdzv_endpoint, "host:29400");
  EXPECT_EQ(back->rdzv_token, "tok");
  EXPECT_EQ(back->round, 4);
  EXPECT_EQ(back->rdzv_tls_ca, "/etc/ca.pem");
  EXPECT_EQ(back->node_addr, "10.0.0.2");
  EXPECT_TRUE(back->output_prefixed);
  EXPECT_EQ(back->error_file, "/logs/attempt_0/1/error.json");
  EXPECT_TRUE(back->heal);
  EXPECT_EQ(back->heal_mark, "/run/heal-mark-1");
  EXPECT_EQ(back->incarnation, 2);
  EXPECT_EQ(back->node_cpus, 6);
  EXPECT_EQ(back->progress_fd, 9);
  EXPECT_EQ(vars.at("OMP_NUM_THREADS"), "1");
  EXPECT_EQ(back->python_fault_handler, "1");
  EXPECT_EQ(back->nccl_async_error_handling, "0");
  EXPECT_EQ(vars["TORCHELASTIC_USE_AGENT_STORE"], "False");
}

TEST(EnvContract, TorchrunsStoreAndNcclVariablesAreAlwaysWrittenAndAnInheritedErrorFileNever) {
  WorkerEnv env;
  auto pairs = env.to_env();
  std::map<std::string, std::string> vars(pairs.begin(), pairs.end());
  // A ddprun started inside a torchrun job inherits TORCHELASTIC_USE_AGENT_STORE=True:
  // it is always overwritten, so no rank waits for an agent store nobody serves.
  EXPECT_EQ(vars["TORCHELASTIC_USE_AGENT_STORE"], "False");
  EXPECT_EQ(vars["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");
  EXPECT_FALSE(vars.count("TORCHELASTIC_ERROR_FILE"));
  // The static form's agent store (the launcher serves the program's store), read back.
  env.use_agent_store = true;
  auto agent = env.to_env();
  std::map<std::string, std::string> agent_vars(agent.begin(), agent.end());
  EXPECT_EQ(agent_vars["TORCHELASTIC_USE_AGENT_STORE"], "True");
  auto back = WorkerEnv::from_env([&](const char* name) -> const char* {
    auto it = agent_vars.find(name);
    return it == agent_vars.end() ? nullptr : it->second.c_str();
  });
  ASSERT_TRUE(back.has_value());
  EXPECT_TRUE(back->use_agent_store);
  const auto& names = contract_variable_names();
  for (const char* name : {"TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                           "TORCHELASTIC_ERROR_FILE"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end())
        << name << " would be inherited";
  }
}

TEST(EnvContract, HealVariablesRoundTripAndAreWrittenOnlyWhenHealIsOn) {
  WorkerEnv env;
  for (const auto& [name, value] : env.to_env()) {
    EXPECT_TRUE(name != "DDP_ON_FAILURE" && name != "DDP_HEAL_MARK" && name != "DDP_INCARNATION")
        << name;
  }
  auto back = parse({{"RANK", "1"},
                     {"WORLD_SIZE", "2"},
                     {"DDP_ON_FAILURE", "heal"},
                     {"DDP_HEAL_MARK", "/m"},
                     {"DDP_INCARNATION", "3"}});
  EXPECT_TRUE(back->heal);
  EXPECT_EQ(back->heal_mark, "/m");
  EXPECT_EQ(back->incarnation, 3);
  EXPECT_FALSE(parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"DDP_ON_FAILURE", "restart"}})->heal);
  try {
    parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"DDP_ON_FAILURE", "heals"}});
    FAIL() << "a malformed DDP_ON_FAILURE must be an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DDP_ON_FAILURE"), std::string::npos) << e.what();
  }
}

TEST(EnvContract, LauncherSettingsAreWrittenOnlyWhenSetAndTheUsersOwnAreNeverStripped) {
  WorkerEnv env;
  for (const auto& [name, value] : env.to_env()) {
    EXPECT_TRUE(name != "DDP_NODE_CPUS" && name != "DDP_PROGRESS_FD" && name != "OMP_NUM_THREADS" &&
                name != "PYTHONFAULTHANDLER")
        << name;
  }
  // A user's OMP_NUM_THREADS or PYTHONFAULTHANDLER is inherited, never dropped.
  const auto& names = contract_variable_names();
  for (const char* name : {"OMP_NUM_THREADS", "PYTHONFAULTHANDLER"}) {
    EXPECT_EQ(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
  try {
    parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"DDP_PROGRESS_FD", "x"}});
    FAIL() << "a malformed DDP_PROGRESS_FD must be an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DDP_PROGRESS_FD"), std::string::npos) << e.what();
  }
}

TEST(EnvContract, OutputPrefixedIsWrittenOnlyWhenTrueAndReadAsZeroOrOne) {
  WorkerEnv env;
  for (const auto& [name, value] : env.to_env()) EXPECT_NE(name, "DDP_OUTPUT_PREFIXED");
  EXPECT_FALSE(parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}})->output_prefixed);
  EXPECT_FALSE(
      parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"DDP_OUTPUT_PREFIXED", "0"}})->output_prefixed);
  EXPECT_TRUE(
      parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"DDP_OUTPUT_PREFIXED", "1"}})->output_prefixed);
  try {
    parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"DDP_OUTPUT_PREFIXED", "yes"}});
    FAIL() << "a malformed DDP_OUTPUT_PREFIXED must be an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DDP_OUTPUT_PREFIXED"), std::string::npos) << e.what();
  }
}

TEST(EnvContract, NoLauncherVariablesMeansAWorldOfOne) { EXPECT_FALSE(parse({})); }

TEST(EnvContract, RdzvVariablesOnlyWrittenWithAnEndpoint) {
  WorkerEnv env;
  for (const auto& [name, value] : env.to_env())
    EXPECT_EQ(name.rfind("DDP_RDZV", 0), std::string::npos);
}

TEST(EnvContract, WithoutAServerTheReasonIsWrittenInsteadOfTheEndpoint) {
  WorkerEnv env;
  env.rdzv_unavailable = "the rendezvous plugin /x/libddprun_rpc.so is missing";
  auto pairs = env.to_env();
  std::map<std::string, std::string> vars(pairs.begin(), pairs.end());
  EXPECT_EQ(vars["DDP_RDZV_UNAVAILABLE"], env.rdzv_unavailable);
  EXPECT_FALSE(vars.count("DDP_RDZV_ENDPOINT"));
  EXPECT_EQ(parse(vars)->rdzv_unavailable, env.rdzv_unavailable);
}

TEST(EnvContract, MalformedValuesNameTheVariable) {
  auto expect_error = [](const std::map<std::string, std::string>& vars,
                         const std::string& needle) {
    try {
      parse(vars);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({{"RANK", "0"}}, "WORLD_SIZE is missing");
  expect_error({{"WORLD_SIZE", "2"}}, "RANK is missing");
  expect_error({{"RANK", "x"}, {"WORLD_SIZE", "2"}}, "RANK='x'");
  expect_error({{"RANK", "2"}, {"WORLD_SIZE", "2"}}, "RANK=2 is out of range");
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE=0");
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "99999"}}, "MASTER_PORT=99999");
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", ""}}, "LOCAL_RANK is empty");
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "1"}, {"LOCAL_RANK", "1"}},
               "LOCAL_RANK=1");
}

TEST(EnvContract, DeviceListsAreWrittenOnlyWhenTheLauncherChoseThem) {
  WorkerEnv env;
  for (const auto& [name, value] : env.to_env()) {
    EXPECT_TRUE(name != "CUDA_VISIBLE_DEVICES" && name != "HIP_VISIBLE_DEVICES") << name;
  }
  env.cuda_visible_devices = "3";
  env.hip_visible_devices = "3";
  auto pairs = env.to_env();
  std::map<std::string, std::string> vars(pairs.begin(), pairs.end());
  EXPECT_EQ(vars["CUDA_VISIBLE_DEVICES"], "3");
  EXPECT_EQ(vars["HIP_VISIBLE_DEVICES"], "3");
  // A user's own lists are inherited, never stripped.
  const auto& names = contract_variable_names();
  for (const char* name : {"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"}) {
    EXPECT_EQ(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
  EXPECT_EQ(visible_devices_variable({0, 2}),
            (std::pair<std::string, std::string>{"CUDA_VISIBLE_DEVICES", "0,2"}));
}

}  // namespace
}  // namespace ddp
