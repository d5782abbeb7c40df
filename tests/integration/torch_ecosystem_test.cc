// Unchanged torch 2.x programs under ddprun, as their projects' docs run them
// under torchrun: examples/torch/train_ddp.py (plain DistributedDataParallel),
// lightning_ddp.py (a Lightning Trainer with strategy="ddp") and
// accelerate_ddp.py (Accelerate's prepare/backward loop) and deepspeed_ddp.py
// (DeepSpeed's initialize/backward/step loop, ZeRO), CPU and Gloo, tiny
// synthetic data. On one node (2 ranks), then on two test hosts (network
// namespaces, one rank each; needs root). Each rank prints a final line
// "TAG key=value ..." with its rank, the world size and a checksum of its
// final weights; the replicas must agree. The interpreter is torch_env.h's;
// every test skips, printing why, when it or the program's module is missing.

#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "netns_hosts.h"
#include "netns_test.h"
#include "subprocess.h"
#include "torch_env.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
const std::string kDdprun = DDPRUN_PATH;
const std::string kExamples = TORCH_EXAMPLES_DIR;

// One of examples/torch's programs and the line each of its ranks ends with.
struct Program {
  std::string script;     // under examples/torch
  std::string module;     // the module it needs beyond torch
  std::string tag;        // its final line: "TAG key=value ..."
  std::string rank_key;   // the key holding the rank the program sees
  std::string world_key;  // the key holding the world size it sees ("" when none)
};
const Program kDdp{"train_ddp.py", "torch", "FINAL_WEIGHTS", "rank", ""};
const Program kLightning{"lightning_ddp.py", "lightning", "LIGHTNING", "rank", "world"};
const Program kAccelerate{"accelerate_ddp.py", "accelerate", "ACCELERATE", "process_index",
                          "num_processes"};
const Program kDeepSpeed{"deepspeed_ddp.py", "deepspeed", "DEEPSPEED", "rank", "world_size"};
const Program kFsdp2{"fsdp2_train.py", "torch", "FSDP2", "rank", "world_size"};

using Fields = std::map<std::string, std::string>;

std::string field(const Fields& fields, const std::string& key) {
  auto it = fields.find(key);
  return it == fields.end() ? "<missing " + key + ">" : it->second;
}

// The final lines of `p` in ddprun's output `out`, as (rank from ddprun's
// "[rank R] " prefix, the line's key=value fields).
std::vector<std::pair<int, Fields>> final_lines(const Program& p, const std::string& out) {
  std::vector<std::pair<int, Fields>> found;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    int rank = -1;
    int consumed = 0;
    if (std::sscanf(line.c_str(), "[rank %d] %n", &rank, &consumed) != 1 || consumed == 0) continue;
    std::istringstream words(line.substr(static_cast<size_t>(consumed)));
    std::string word;
    if (!(words >> word) || word != p.tag) continue;
    Fields fields;
    while (words >> word) {
      const auto eq = word.find('=');
      if (eq != std::string::npos) fields[word.substr(0, eq)] = word.substr(eq + 1);
    }
    found.emplace_back(rank, fields);
  }
  return found;
}

// `out` (every ddprun of the job, joined) holds exactly one final line per
// rank 0..world-1, each printed by the rank ddprun gave that number, saying
// world size `world`, with the same weights on every rank. Returns the
// lines' fields by rank.
std::map<int, Fields> expect_ranks_in_sync(const Program& p, const std::string& out, int world) {
  std::map<int, Fields> by_rank;
  for (const auto& [rank, fields] : final_lines(p, out)) {
    EXPECT_TRUE(by_rank.emplace(rank, fields).second)
        << "rank " << rank << " printed two " << p.tag << " lines";
    EXPECT_EQ(field(fields, p.rank_key), std::to_string(rank))
        << "the program's rank is not the one ddprun gave it";
    if (!p.world_key.empty()) {
      EXPECT_EQ(field(fields, p.world_key), std::to_string(world));
    }
  }
  std::set<int> ranks, want;
  for (const auto& [rank, fields] : by_rank) ranks.insert(rank);
  for (int rank = 0; rank < world; ++rank) want.insert(rank);
  EXPECT_EQ(ranks, want) << "one " << p.tag << " line per rank expected\n" << out;
  if (by_rank.size() == static_cast<size_t>(world) && world > 0) {
    const Fields& first = by_rank.begin()->second;
    EXPECT_TRUE(first.count("sum") && first.count("abs_sum")) << out;
    for (const auto& [rank, fields] : by_rank) {
      EXPECT_EQ(field(fields, "sum"), field(first, "sum")) << "rank " << rank << " diverged\n"
                                                           << out;
      EXPECT_EQ(field(fields, "abs_sum"), field(first, "abs_sum"))
          << "rank " << rank << " diverged\n"
          << out;
    }
  }
  return by_rank;
}

// Why `p` cannot run here, printed (ctest shows a skipped test's output), or "".
std::string skip_reason(const Program& p) {
  const std::string why = torch2_unavailable_reason(p.module);
  if (!why.empty()) std::printf("skipped: %s\n", why.c_str());
  return why;
}

// The build tree's ddprun package (the "ddp" backend) comes first on the path.
std::map<std::string, std::string> python_env() {
  return {{"DDP_PYTHON", torch2_python()}, {"PYTHONPATH", DDP_TORCH_PACKAGE_DIR}};
}

// --- one node, two ranks -------------------------------------------------------

// ddprun --nproc_per_node=2 PROGRAM ARGS..., finished (bounded).
struct OneNodeRun {
  pid_t ddprun_pid;
  ProcessResult result;
};
OneNodeRun run_on_one_node(const Program& p, const std::vector<std::string>& args = {}) {
  std::vector<std::string> argv = {kDdprun, "--nproc_per_node=2", kExamples + "/" + p.script};
  argv.insert(argv.end(), args.begin(), args.end());
  Subprocess ddprun(argv, python_env());
  OneNodeRun run{ddprun.pid(), ddprun.wait(90s)};
  return run;
}

TEST(TorchEcosystem, LightningTrainerTakesDdprunsTwoRanksAndStartsNoProcessOfItsOwn) {
  if (auto why = skip_reason(kLightning); !why.empty()) GTEST_SKIP() << why;
  auto [ddprun_pid, r] = run_on_one_node(kLightning);
  ASSERT_TRUE(r.exited) << "ddprun did not finish in time\n" << r.out << r.err;
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  auto ranks = expect_ranks_in_sync(kLightning, r.out, 2);
  std::set<std::string> pids;
  for (const auto& [rank, fields] : ranks) {
    // Lightning found torchelastic's variables (TORCHELASTIC_RUN_ID, ...) ...
    EXPECT_EQ(field(fields, "env"), "TorchElasticEnvironment") << "rank " << rank << "\n" << r.out;
    // ... so each rank is a worker ddprun started, not a process Lightning started.
    EXPECT_EQ(field(fields, "ppid"), std::to_string(ddprun_pid)) << "rank " << rank << "\n"
                                                                 << r.out;
    pids.insert(field(fields, "pid"));
  }
  EXPECT_EQ(pids.size(), 2u) << r.out;
}

TEST(TorchEcosystem, AccelerateTakesDdprunsTwoRanksAsMultiCpu) {
  if (auto why = skip_reason(kAccelerate); !why.empty()) GTEST_SKIP() << why;
  auto [ddprun_pid, r] = run_on_one_node(kAccelerate);
  ASSERT_TRUE(r.exited) << "ddprun did not finish in time\n" << r.out << r.err;
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  auto ranks = expect_ranks_in_sync(kAccelerate, r.out, 2);
  for (const auto& [rank, fields] : ranks) {
    EXPECT_EQ(field(fields, "distributed_type"), "DistributedType.MULTI_CPU")
        << "rank " << rank << "\n"
        << r.out;
  }
  // accelerator.print: the main process only, once per epoch.
  EXPECT_EQ(lines_with_prefix(r.out, "[rank 0] epoch ").size(), 2u) << r.out;
  EXPECT_TRUE(lines_with_prefix(r.out, "[rank 1] epoch ").empty()) << r.out;
}

TEST(TorchEcosystem, DeepSpeedZeroStageTwoTakesDdprunsTwoRanks) {
  if (auto why = skip_reason(kDeepSpeed); !why.empty()) GTEST_SKIP() << why;
  auto [ddprun_pid, r] = run_on_one_node(kDeepSpeed, {"--zero-stage", "2"});
  ASSERT_TRUE(r.exited) << "ddprun did not finish in time\n" << r.out << r.err;
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  auto ranks = expect_ranks_in_sync(kDeepSpeed, r.out, 2);
  for (const auto& [rank, fields] : ranks) {
    EXPECT_EQ(field(fields, "zero_stage"), "2") << "rank " << rank << "\n" << r.out;
  }
  // DeepSpeed's own report, on rank 0 only.
  EXPECT_EQ(lines_with_prefix(r.out, "[rank 0] step ").size(), 2u) << r.out;
  EXPECT_TRUE(lines_with_prefix(r.out, "[rank 1] step ").empty()) << r.out;
}

// --- the same programs on the "ddp" backend ------------------------------------

// Each program with --backend gloo, then --backend ddp: both runs in sync,
// ending with the same weights. Two ranks sum in one order, so the weights
// agree to the bit.
void expect_ddp_backend_matches_gloo(
    const Program& p, std::vector<std::string> args,
    const std::function<std::string(const Program&, const std::vector<std::string>&)>& run) {
  std::map<std::string, Fields> rank0;
  for (std::string backend : {"gloo", "ddp"}) {
    auto with_backend = args;
    with_backend.insert(with_backend.end(), {"--backend", backend});
    const std::string out = run(p, with_backend);
    auto ranks = expect_ranks_in_sync(p, out, 2);
    if (ranks.count(0)) rank0[backend] = ranks[0];
  }
  ASSERT_EQ(rank0.size(), 2u);
  EXPECT_EQ(field(rank0["ddp"], "sum"), field(rank0["gloo"], "sum")) << p.script;
  EXPECT_EQ(field(rank0["ddp"], "abs_sum"), field(rank0["gloo"], "abs_sum")) << p.script;
}

std::string one_node_output(const Program& p, const std::vector<std::string>& args) {
  auto run = run_on_one_node(p, args);
  EXPECT_TRUE(run.result.exited && run.result.code == 0) << run.result.out << run.result.err;
  return run.result.out;
}

TEST(TorchEcosystemOnDdp, PlainDdpProgram) {
  if (auto why = skip_reason(kDdp); !why.empty()) GTEST_SKIP() << why;
  expect_ddp_backend_matches_gloo(kDdp, {"--epochs", "2"}, one_node_output);
}

TEST(TorchEcosystemOnDdp, Fsdp2FullyShard) {
  if (auto why = skip_reason(kFsdp2); !why.empty()) GTEST_SKIP() << why;
  expect_ddp_backend_matches_gloo(kFsdp2, {}, one_node_output);
}

TEST(TorchEcosystemOnDdp, LightningDdpStrategyWithProcessGroupBackend) {
  if (auto why = skip_reason(kLightning); !why.empty()) GTEST_SKIP() << why;
  expect_ddp_backend_matches_gloo(kLightning, {}, one_node_output);
}

TEST(TorchEcosystemOnDdp, DeepSpeedZeroStageTwoWithDistBackend) {
  if (auto why = skip_reason(kDeepSpeed); !why.empty()) GTEST_SKIP() << why;
  expect_ddp_backend_matches_gloo(kDeepSpeed, {"--zero-stage", "2"}, one_node_output);
}

TEST(TorchEcosystemOnDdp, AccelerateWithTheGroupMadeFirst) {
  if (auto why = skip_reason(kAccelerate); !why.empty()) GTEST_SKIP() << why;
  expect_ddp_backend_matches_gloo(kAccelerate, {}, one_node_output);
}

// --- two test hosts, one rank each -------------------------------------------

class TorchEcosystemMultiHost : public NetnsTest {
 protected:
  // ddprun on both test hosts: `launch(hosts, host)` (its flags), one rank,
  // then `p` with `args`; waits for both. pids_ gets each ddprun's pid
  // (`ip netns exec` execs it).
  using Launch = std::function<std::vector<std::string>(const NetnsHosts&, int)>;
  std::vector<ProcessResult> run_on_two_hosts(const Program& p, const Launch& launch,
                                              const std::vector<std::string>& args = {}) {
    NetnsHosts hosts(2);
    // Gloo binds to the address this machine's hostname resolves to; every
    // test host shares that name, which resolves to 127.0.0.1 (or to no
    // address a namespace has), so Gloo would pick loopback and the ranks
    // could not connect (torchrun's too). Clusters whose hostname does not
    // name the right interface set this; so do we.
    auto env = python_env();
    env["GLOO_SOCKET_IFNAME"] = "eth0";
    std::vector<std::unique_ptr<Subprocess>> nodes;
    for (int host = 0; host < 2; ++host) {
      std::vector<std::string> argv = {kDdprun};
      for (const auto& flag : launch(hosts, host)) argv.push_back(flag);
      argv.push_back("--nproc_per_node=1");
      argv.push_back(kExamples + "/" + p.script);
      argv.insert(argv.end(), args.begin(), args.end());
      nodes.push_back(std::make_unique<Subprocess>(hosts.on(host, argv), env));
      pids_.push_back(nodes.back()->pid());
    }
    std::vector<ProcessResult> results;
    for (auto& node : nodes) results.push_back(node->wait(90s));
    return results;
  }

  // Both hosts' ddprun exited 0; returns their output joined.
  static std::string both_ok(const std::vector<ProcessResult>& r) {
    for (size_t host = 0; host < r.size(); ++host) {
      EXPECT_TRUE(r[host].exited) << "host " << host << "'s ddprun did not finish in time\n"
                                  << r[host].err;
      EXPECT_EQ(r[host].code, 0) << "host " << host << "\n" << r[host].out << r[host].err;
    }
    return r.at(0).out + r.at(1).out;
  }

  // Static form (torchrun's default): host 0 hosts the rendezvous; --master_addr
  // is its IP address.
  static std::vector<std::string> static_form(const NetnsHosts& hosts, int host) {
    return {"--nnodes=2", "--node_rank=" + std::to_string(host),
            "--master_addr=" + hosts.address(0), "--master_port=29500"};
  }

  std::vector<pid_t> pids_;
};

TEST_F(TorchEcosystemMultiHost, DdpProgramStaticForm) {
  if (auto why = skip_reason(kDdp); !why.empty()) GTEST_SKIP() << why;
  auto r = run_on_two_hosts(kDdp, static_form, {"--epochs", "2"});
  const std::string out = both_ok(r);
  expect_ranks_in_sync(kDdp, out, 2);
  EXPECT_NE(r[0].out.find("[rank 0] training on 2 rank(s)"), std::string::npos) << r[0].out;
}

TEST_F(TorchEcosystemMultiHost, LightningStaticFormOneDevicePerNode) {
  if (auto why = skip_reason(kLightning); !why.empty()) GTEST_SKIP() << why;
  // Lightning wants devices * num_nodes == WORLD_SIZE: one rank on each of two nodes.
  auto r = run_on_two_hosts(kLightning, static_form, {"--devices", "1", "--num_nodes", "2"});
  const std::string out = both_ok(r);
  auto ranks = expect_ranks_in_sync(kLightning, out, 2);
  for (const auto& [rank, fields] : ranks) {
    EXPECT_EQ(field(fields, "env"), "TorchElasticEnvironment") << "rank " << rank << "\n" << out;
    // Rank R runs on host R (node rank R, one rank each), started by that host's ddprun.
    EXPECT_EQ(field(fields, "ppid"), std::to_string(pids_.at(static_cast<size_t>(rank))))
        << "rank " << rank << "\n"
        << out;
  }
}

TEST_F(TorchEcosystemMultiHost, AccelerateC10dFormSameCommandOnBothHosts) {
  if (auto why = skip_reason(kAccelerate); !why.empty()) GTEST_SKIP() << why;
  auto r = run_on_two_hosts(kAccelerate, [](const NetnsHosts& hosts, int) {
    return std::vector<std::string>{"--nnodes=2", "--rdzv_backend=c10d",
                                    "--rdzv_endpoint=" + hosts.address(0) + ":29400",
                                    "--rdzv_id=accelerate1"};
  });
  const std::string out = both_ok(r);
  auto ranks = expect_ranks_in_sync(kAccelerate, out, 2);
  for (const auto& [rank, fields] : ranks) {
    EXPECT_EQ(field(fields, "distributed_type"), "DistributedType.MULTI_CPU")
        << "rank " << rank << "\n"
        << out;
  }
}

// The "ddp" backend across two hosts (Gloo over TCP between them), against
// torch's Gloo: the plain DDP program and FSDP2.
TEST_F(TorchEcosystemMultiHost, DdpBackendAcrossHostsEndsWithGloosWeights) {
  if (auto why = skip_reason(kFsdp2); !why.empty()) GTEST_SKIP() << why;
  auto two_hosts = [this](const Program& p, const std::vector<std::string>& args) {
    return both_ok(run_on_two_hosts(p, static_form, args));
  };
  expect_ddp_backend_matches_gloo(kDdp, {"--epochs", "2"}, two_hosts);
  expect_ddp_backend_matches_gloo(kFsdp2, {}, two_hosts);
}

// Lightning, DeepSpeed and Accelerate on "ddp" across the two hosts too.
TEST_F(TorchEcosystemMultiHost, DdpBackendAcrossHostsUnderLightningDeepSpeedAndAccelerate) {
  for (const Program* p : {&kLightning, &kDeepSpeed, &kAccelerate}) {
    if (auto why = skip_reason(*p); !why.empty()) GTEST_SKIP() << why;
  }
  auto two_hosts = [this](const Program& p, const std::vector<std::string>& args) {
    return both_ok(run_on_two_hosts(p, static_form, args));
  };
  expect_ddp_backend_matches_gloo(kLightning, {"--devices", "1", "--num_nodes", "2"}, two_hosts);
  expect_ddp_backend_matches_gloo(kDeepSpeed, {"--zero-stage", "2"}, two_hosts);
  expect_ddp_backend_matches_gloo(kAccelerate, {}, two_hosts);
}

TEST_F(TorchEcosystemMultiHost, DeepSpeedStaticFormZeroStageOne) {
  if (auto why = skip_reason(kDeepSpeed); !why.empty()) GTEST_SKIP() << why;
  auto r = run_on_two_hosts(kDeepSpeed, static_form, {"--zero-stage", "1"});
  expect_ranks_in_sync(kDeepSpeed, both_ok(r), 2);
}

}  // namespace
}  // namespace ddp::testing
