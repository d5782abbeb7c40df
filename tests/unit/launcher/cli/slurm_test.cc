// Slurm's hostlist syntax, a job step's variables, and what ddprun's command
// line takes from them (explicit flags and PET_* win).

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <map>
#include <string>
#include <vector>

#include "cli/launch_spec.h"
#include "cli/slurm_hostlist.h"
#include "cli/slurm_step.h"
#include "ddp/common/error.h"
#include "error_of.h"
#include "scoped_env.h"

namespace ddp::launcher {
namespace {

using ::ddp::testing::error_of;
using ::ddp::testing::ScopedEnvs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// --- hostlist ------------------------------------------------------------------

TEST(SlurmHostlist, FormsSlurmDocuments) {
  EXPECT_THAT(expand_hostlist("n1"), ElementsAre("n1"));
  EXPECT_THAT(expand_hostlist("n1,n2,login"), ElementsAre("n1", "n2", "login"));
  EXPECT_THAT(expand_hostlist("n[1-3]"), ElementsAre("n1", "n2", "n3"));
  EXPECT_THAT(expand_hostlist("gpu[01-04,07],login1"),
              ElementsAre("gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "login1"));
  EXPECT_THAT(expand_hostlist("n[009-011]"),
              ElementsAre("n009", "n010", "n011"));  // padding kept past 9
  EXPECT_THAT(expand_hostlist("n[8-10]"), ElementsAre("n8", "n9", "n10"));
  EXPECT_THAT(expand_hostlist("rack[1-2]-n[1-2]"),
              ElementsAre("rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"));
  EXPECT_THAT(expand_hostlist("a[1,3]b,c[2]"), ElementsAre("a1b", "a3b", "c2"));
  EXPECT_THAT(expand_hostlist("node-1.cluster"), ElementsAre("node-1.cluster"));
  EXPECT_THAT(expand_hostlist("[1-2]"), ElementsAre("1", "2"));
}

TEST(SlurmHostlist, FirstHostDoesNotExpandTheRest) {
  EXPECT_EQ(first_host("gpu[07-09,11],login1"), "gpu07");
  EXPECT_EQ(first_host("rack[2-3]-n[005-900000000]"), "rack2-n005");
  EXPECT_EQ(first_host("login1,gpu[1-2]"), "login1");
}

TEST(SlurmHostlist, MalformedListsNameTheProblem) {
  EXPECT_THAT(error_of([] { expand_hostlist(""); }), HasSubstr("empty"));
  EXPECT_THAT(error_of([] { expand_hostlist("n[1-3"); }), HasSubstr("'[' without ']'"));
  EXPECT_THAT(error_of([] { expand_hostlist("n1-3]"); }), HasSubstr("']' without '['"));
  EXPECT_THAT(error_of([] { expand_hostlist("n[3-1]"); }), HasSubstr("range '3-1' runs backwards"));
  EXPECT_THAT(error_of([] { expand_hostlist("n[a-b]"); }),
              HasSubstr("'a' in brackets is not a number"));
  EXPECT_THAT(error_of([] { expand_hostlist("n[1-2],,m"); }), HasSubstr("an empty host name"));
  EXPECT_THAT(error_of([] { expand_hostlist("n[1-999999999]"); }), HasSubstr("more than"));
  EXPECT_THAT(error_of([] { expand_hostlist("n[1-2"); }), HasSubstr("hostlist 'n[1-2'"));
}

// --- a step's variables --------------------------------------------------------

using Env = std::map<std::string, std::string>;

std::optional<SlurmStep> step_of(const Env& env) {
  return read_slurm_step([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

const Env kTwoNodeStep = {{"SLURM_JOB_ID", "4242"},
                          {"SLURM_STEP_ID", "0"},
                          {"SLURM_STEP_NUM_NODES", "2"},
                          {"SLURM_NNODES", "3"},
                          {"SLURM_NODEID", "1"},
                          {"SLURM_STEP_NODELIST", "gpu[07-08]"},
                          {"SLURM_JOB_NODELIST", "gpu[07-09]"},
                          {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}};

TEST(SlurmStep, OutsideAStepThereIsNone) {
  EXPECT_FALSE(step_of({}).has_value());
  EXPECT_FALSE(step_of({{"SLURM_JOB_ID", "1"}}).has_value())
      << "a batch script or salloc shell is not a step";
}

TEST(SlurmStep, AStepGivesNodesRankFirstHostAndIds) {
  auto s = step_of(kTwoNodeStep);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->num_nodes, 2) << "the step's count wins over the job's";
  EXPECT_EQ(s->node_id, 1);
  EXPECT_EQ(s->first_host, "gpu07");
  EXPECT_EQ(s->run_id(), "slurm-4242.0");
  EXPECT_EQ(s->master_port(), step_of(kTwoNodeStep)->master_port()) << "the same on every node";
  EXPECT_GE(s->master_port(), 10000);
  EXPECT_LE(s->master_port(), 19998);
  EXPECT_EQ(s->master_port() % 2, 0);
  Env other = kTwoNodeStep;
  other["SLURM_STEP_ID"] = "1";
  EXPECT_NE(step_of(other)->master_port(), s->master_port());

  Env job_only = kTwoNodeStep;  // older srun: only the job's variables
  job_only.erase("SLURM_STEP_NUM_NODES");
  job_only.erase("SLURM_STEP_NODELIST");
  job_only.erase("SLURM_STEP_TASKS_PER_NODE");
  auto j = step_of(job_only);
  EXPECT_EQ(j->num_nodes, 3);
  EXPECT_EQ(j->num_nodes_var, "SLURM_NNODES");
  EXPECT_EQ(j->nodelist_var, "SLURM_JOB_NODELIST");
}

TEST(SlurmStep, TasksPerNodeSyntax) {
  EXPECT_EQ(tasks_on_node("1", 0), 1);
  EXPECT_EQ(tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(tasks_on_node("2(x3),1", 3), 1);
  EXPECT_THAT(error_of([] { tasks_on_node("2(x3),1", 4); }), HasSubstr("lists 4 node(s)"));
  EXPECT_THAT(error_of([] { tasks_on_node("2(3)", 0); }), HasSubstr("expected an integer"));
}

TEST(SlurmStep, MisuseNamesTheSlurmVariableAndTheFix) {
  Env two_tasks = kTwoNodeStep;
  two_tasks["SLURM_STEP_TASKS_PER_NODE"] = "2(x2)";
  std::string e = error_of([&] { step_of(two_tasks); });
  EXPECT_THAT(
      e, HasSubstr("SLURM_STEP_TASKS_PER_NODE=2(x2): srun started 2 ddprun tasks on this node"));
  EXPECT_THAT(e, HasSubstr("srun --ntasks-per-node=1"));

  Env outside = kTwoNodeStep;
  outside["SLURM_NODEID"] = "2";
  EXPECT_THAT(error_of([&] { step_of(outside); }),
              HasSubstr("SLURM_NODEID=2 is not below SLURM_STEP_NUM_NODES=2"));

  Env junk = kTwoNodeStep;
  junk["SLURM_STEP_NUM_NODES"] = "two";
  EXPECT_THAT(error_of([&] { step_of(junk); }),
              HasSubstr("SLURM_STEP_NUM_NODES=two: expected an integer"));

  Env bad_list = kTwoNodeStep;
  bad_list["SLURM_STEP_NODELIST"] = "gpu[07-";
  EXPECT_THAT(error_of([&] { step_of(bad_list); }), HasSubstr("hostlist 'gpu[07-'"));
}

// --- the command line inside a step -------------------------------------------

LaunchSpec parse(std::vector<std::string> args) {
  args.insert(args.begin(), "ddprun");
  auto outcome = parse_launch_args(args, /*check_program=*/false);
  if (!outcome.spec) throw Error("no spec: " + outcome.message);
  return *outcome.spec;
}

TEST(SlurmLaunch, AStepOfTwoNodesIsOneJob) {
  ScopedEnvs env(kTwoNodeStep);
  LaunchSpec s = parse({"--nproc_per_node=2", "train.py"});
  EXPECT_EQ(s.nnodes, 2);
  EXPECT_EQ(s.min_nodes, 2);
  EXPECT_EQ(s.node_rank, 1);
  EXPECT_EQ(s.rdzv_backend, RdzvBackend::kStatic);
  EXPECT_EQ(s.master_addr, "gpu07");
  const int port = step_of(kTwoNodeStep)->master_port();
  EXPECT_EQ(s.master_port, port);
  EXPECT_EQ(s.rdzv_host, "gpu07");
  EXPECT_EQ(s.rdzv_port, port);  // the static form's one port: the rendezvous and the agent store
  EXPECT_TRUE(s.agent_store);
  EXPECT_EQ(s.run_id, "slurm-4242.0");
  EXPECT_FALSE(s.hosts_rendezvous()) << "node 1";
  ASSERT_EQ(s.notices.size(), 1u);
  EXPECT_THAT(s.notices[0],
              HasSubstr("Slurm job 4242 step 0: took 2 node(s) (SLURM_STEP_NUM_NODES), node rank 1 "
                        "(SLURM_NODEID), rendezvous at gpu07:"));
  EXPECT_THAT(s.notices[0], HasSubstr("run id slurm-4242.0"));
}

TEST(SlurmLaunch, FlagsAndPetVariablesWin) {
  ScopedEnvs env(kTwoNodeStep);
  LaunchSpec s =
      parse({"--master_addr=10.1.1.1", "--master_port=30000", "--rdzv_id=mine", "train.py"});
  EXPECT_EQ(s.rdzv_host, "10.1.1.1");
  EXPECT_EQ(s.rdzv_port, 30000);
  EXPECT_EQ(s.run_id, "mine");
  EXPECT_EQ(s.node_rank, 1);

  // Everything given: Slurm is not consulted (a misused step would not even be noticed).
  Env two_tasks = {{"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}};
  ScopedEnvs misuse(two_tasks);
  LaunchSpec own = parse({"--nnodes=4", "--node_rank=3", "--master_addr=10.1.1.1", "train.py"});
  EXPECT_EQ(own.nnodes, 4);
  EXPECT_EQ(own.node_rank, 3);
  EXPECT_TRUE(own.notices.empty());
  EXPECT_EQ(parse({"--nnodes=1", "train.py"}).nnodes, 1) << "a single node asked for";
  EXPECT_EQ(parse({"--standalone", "train.py"}).nnodes, 1);
  {
    ScopedEnvs pet(Env{{"PET_NNODES", "1"}});
    EXPECT_EQ(parse({"train.py"}).nnodes, 1) << "PET_NNODES=1 is asked for too";
  }
  EXPECT_THAT(error_of([] { parse({"train.py"}); }),
              HasSubstr("srun started 2 ddprun tasks on this node"));
}

TEST(SlurmLaunch, ElasticSizeKeepsAssignedRanksAndTooFewNodesIsAnError) {
  ScopedEnvs env(kTwoNodeStep);
  LaunchSpec elastic = parse({"--nnodes=1:2", "train.py"});
  EXPECT_EQ(elastic.rdzv_backend, RdzvBackend::kC10d);
  EXPECT_EQ(elastic.node_rank, -1);
  EXPECT_EQ(elastic.rdzv_host, "gpu07");
  // The c10d form: MASTER_PORT is the program's, the rendezvous takes the next port.
  EXPECT_EQ(elastic.rdzv_port, step_of(kTwoNodeStep)->master_port() + 1);
  EXPECT_FALSE(elastic.agent_store);
  std::string e = error_of([] { parse({"--nnodes=4", "train.py"}); });
  EXPECT_THAT(
      e,
      HasSubstr("--nnodes=4 needs more nodes than this Slurm step has (SLURM_STEP_NUM_NODES=2)"));
  EXPECT_THAT(e, HasSubstr("srun -N4"));
}

TEST(SlurmLaunch, TheStepsGpusBecomeTheWorkersWhenCudaVisibleDevicesIsUnset) {
  Env with_gpus = kTwoNodeStep;
  with_gpus["SLURM_STEP_GPUS"] = "2,3";
  unsetenv("CUDA_VISIBLE_DEVICES");
  {
    ScopedEnvs env(with_gpus);
    LaunchSpec s = parse({"--nproc_per_node=gpu", "train.py"});
    EXPECT_EQ(s.nproc_per_node, 2);
    EXPECT_EQ(s.cuda_visible_devices, "2,3");
    EXPECT_THAT(s.notices.at(0), HasSubstr("CUDA_VISIBLE_DEVICES=2,3 (SLURM_STEP_GPUS)"));
  }
  with_gpus["CUDA_VISIBLE_DEVICES"] = "0";  // Slurm's gres set it: it stands
  ScopedEnvs env(with_gpus);
  LaunchSpec s = parse({"--nproc_per_node=gpu", "train.py"});
  EXPECT_EQ(s.nproc_per_node, 1);
  EXPECT_TRUE(s.cuda_visible_devices.empty());
}

}  // namespace
}  // namespace ddp::launcher
