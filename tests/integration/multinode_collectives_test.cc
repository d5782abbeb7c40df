// Multi-node jobs on loopback running libddp's collectives and the reference
// trainer: nodes of equal and unequal sizes, on shm and the default backend.

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "multinode_harness.h"
#include "shm_segments.h"
#include "subprocess.h"

namespace ddp::testing {
namespace {

using namespace multinode_test;
using ::ddp::testing::shm_segments_of;

// libddp's default backend across nodes: DDP_BACKEND unset and no GPU visible,
// so "auto" picks shm where a node has several ranks.
std::map<std::string, std::string> collective_env(std::map<std::string, std::string> extra = {}) {
  std::map<std::string, std::string> env = kToken;
  env["DDP_BACKEND"] = "\x01";
  env["CUDA_VISIBLE_DEVICES"] = "";
  env["DDP_DEBUG"] = "\x01";
  env["DDP_GLOO_IFACE"] = "\x01";
  env["DDP_TIMEOUT_S"] = "30";
  for (auto& [k, v] : extra) env[k] = v;
  return env;
}

// The ranks of `out` that printed "<marker> rank=R world=W backend=B", by rank.
std::map<int, std::string> reports(const std::string& out, const std::string& marker) {
  std::map<int, std::string> found;
  for (const auto& line : lines_with_prefix(out, "[rank ")) {
    auto pos = line.find(marker + " rank=");
    if (pos != std::string::npos)
      found[std::stoi(line.substr(pos + marker.size() + 6))] = line.substr(pos);
  }
  return found;
}

// Runs collective_worker `mode` on nodes of the given sizes (one agent each) and
// expects every rank to report `marker` OK on `backend`.
void run_collectives(const std::vector<int>& node_sizes, const std::vector<std::string>& mode,
                     const std::string& marker, const std::string& backend,
                     const std::map<std::string, std::string>& env) {
  std::string ep = "127.0.0.1:" + std::to_string(free_port());
  // A run id of its own: ddprun removes its run's segments at the end, which must
  // not touch another test's job running at the same time.
  static int runs = 0;
  const std::string run_id = "mncoll" + std::to_string(getpid()) + "x" + std::to_string(runs++);
  int world = 0;
  for (int s : node_sizes) world += s;
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int node = 0; node < static_cast<int>(node_sizes.size()); ++node) {
    std::vector<std::string> program = {kCollectiveWorker};
    program.insert(program.end(), mode.begin(), mode.end());
    nodes.push_back(agent(ep, static_cast<int>(node_sizes.size()), node, node_sizes[node], program,
                          {}, env, run_id));
  }
  std::map<int, std::string> all;
  for (int node = 0, first = 0; node < static_cast<int>(nodes.size());
       first += node_sizes[node], ++node) {
    auto r = nodes[node]->wait(90s);
    ASSERT_TRUE(r.exited) << "node " << node << " did not finish\n" << r.err << r.out;
    EXPECT_EQ(r.code, 0) << "node " << node << "\n" << r.err << r.out;
    auto mine = reports(r.out, marker);
    for (int rank = first; rank < first + node_sizes[node]; ++rank) {
      EXPECT_EQ(mine[rank], marker + " rank=" + std::to_string(rank) +
                                " world=" + std::to_string(world) + " backend=" + backend)
          << "node " << node << "\n"
          << r.out << r.err;
    }
    all.insert(mine.begin(), mine.end());
  }
  EXPECT_EQ(static_cast<int>(all.size()), world);
  EXPECT_EQ(shm_segments_of(run_id), std::vector<std::string>{});
}

// Two nodes of two ranks: shm inside each node, all-reduce hierarchical (Gloo
// between the ranks of equal local rank), the other collectives Gloo over all.
TEST(MultiNodeCollectives, TwoNodesOfTwoRunEveryCollectiveOnTheDefaultBackend) {
  run_collectives({2, 2}, {"all"}, "COLLECTIVES OK", "shm", collective_env());
}

// Up to 16 MiB: several chunks, private and zero-copy, each slice then across nodes.
TEST(MultiNodeCollectives, TwoNodesOfTwoRunLargeAllReducesOnTheDefaultBackend) {
  run_collectives({2, 2}, {"large", "16"}, "LARGE OK", "shm", collective_env());
}

// Nodes of different sizes: no hierarchy, the shm backend hands everything to
// Gloo over all ranks (the single rank of node 1 has no segment at all).
TEST(MultiNodeCollectives, NodesOfTwoAndOneRunEveryCollectiveOnShm) {
  run_collectives({2, 1}, {"all"}, "COLLECTIVES OK", "shm",
                  collective_env({{"DDP_BACKEND", "shm"}}));
}

// Nodes of different sizes under "auto": every node must pick the same backend.
// auto decides on a job-wide fact (shm when WORLD_SIZE > GROUP_WORLD_SIZE), so
// node 1's single rank runs shm too (all Gloo underneath); deciding per node
// (by LOCAL_WORLD_SIZE) deadlocked this job until the timeout.
TEST(MultiNodeCollectives, NodesOfTwoAndOneRunEveryCollectiveOnTheDefaultBackend) {
  run_collectives({2, 1}, {"all"}, "COLLECTIVES OK", "shm",
                  collective_env({{"DDP_TIMEOUT_S", "10"}}));
}

#ifdef TRAIN_PATH
// The reference trainer on two nodes of two ranks (shm in each node, the
// gradients' all-reduce hierarchical, ParamShards' gather over Gloo across
// nodes): the sharded optimizer ends with the plain run's loss to the last digit.
std::string final_loss_line(const std::string& out) {
  for (const auto& line : lines_with_prefix(out, "[rank 0] summary: ")) {
    auto at = line.find("final loss ");
    if (at != std::string::npos) return line.substr(at, line.find(' ', at + 11) - at);
  }
  return "";
}

// `program` as two ddprun nodes of two ranks each (a fresh endpoint); node 0's
// and node 1's results.
std::pair<ProcessResult, ProcessResult> train_on_two_nodes(const std::vector<std::string>& program,
                                                           const std::string& run_id) {
  std::string ep = "127.0.0.1:" + std::to_string(free_port());
  auto env = collective_env({{"OPENBLAS_NUM_THREADS", "1"}});
  auto n0 = agent(ep, 2, 0, 2, program, {}, env, run_id);
  auto n1 = agent(ep, 2, 1, 2, program, {}, env, run_id);
  auto r1 = n1->wait(90s);
  auto r0 = n0->wait(90s);
  return {r0, r1};
}

TEST(MultiNodeTrain, TwoNodesOfTwoTrainShardedAsTheyDoPlain) {
  std::map<std::string, std::string> results;
  for (const std::string variant : {"plain", "sharded"}) {
    const std::string run_id = "mntrain" + std::to_string(getpid()) + variant;
    std::vector<std::string> program = {
        TRAIN_PATH,    "--hidden", "48",   "--layers", "2",           "--steps", "20",
        "--optimizer", "adam",     "--lr", "0.01",     "--log_every", "5"};
    if (variant == "sharded") program.push_back("--shard_optimizer");
    auto [r0, r1] = train_on_two_nodes(program, run_id);
    ASSERT_TRUE(r0.exited && r1.exited) << r0.out << r0.err << r1.out << r1.err;
    ASSERT_EQ(r0.code, 0) << r0.out << r0.err;
    ASSERT_EQ(r1.code, 0) << r1.out << r1.err;
    EXPECT_NE(r0.out.find("train: 4 rank(s) (shm)"), std::string::npos) << r0.out;
    results[variant] = final_loss_line(r0.out);
    EXPECT_NE(results[variant], "") << r0.out;
    EXPECT_EQ(shm_segments_of(run_id), std::vector<std::string>{});
  }
  EXPECT_EQ(results["sharded"], results["plain"]);
}
#endif

}  // namespace
}  // namespace ddp::testing
