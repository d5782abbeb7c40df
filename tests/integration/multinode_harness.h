#pragma once
// What the multi-node integration tests share: ddprun agents on loopback as
// separate nodes, with fast liveness settings and a rendezvous token.

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "subprocess.h"

namespace ddp::testing::multinode_test {

using namespace std::chrono_literals;
inline const std::string kDdprun = DDPRUN_PATH;
inline const std::string kWorker = TEST_WORKER_PATH;
inline const std::string kCollectiveWorker = COLLECTIVE_WORKER_PATH;
inline const std::map<std::string, std::string> kToken = {{"DDP_RDZV_TOKEN", "test-secret"}};
// Fast liveness settings so failures propagate in about 2 s.
inline const std::string kFastConf =
    "--rdzv_conf=heartbeat_interval=0.2,heartbeat_timeout=2,join_timeout=20";

inline std::unique_ptr<Subprocess> agent(const std::string& endpoint, int nnodes, int node_rank,
                                         int nproc, std::vector<std::string> program,
                                         std::vector<std::string> extra = {},
                                         std::map<std::string, std::string> env = kToken,
                                         const std::string& run_id = "mn") {
  std::vector<std::string> args = {kDdprun,
                                   "--nnodes=" + std::to_string(nnodes),
                                   "--nproc_per_node=" + std::to_string(nproc),
                                   "--rdzv_endpoint=" + endpoint,
                                   "--run_id=" + run_id,
                                   kFastConf};
  if (node_rank >= 0) args.push_back("--node_rank=" + std::to_string(node_rank));
  args.insert(args.end(), extra.begin(), extra.end());
  args.insert(args.end(), program.begin(), program.end());
  return std::make_unique<Subprocess>(args, env);
}

}  // namespace ddp::testing::multinode_test
