#pragma once
// Plain types of the rendezvous membership protocol, shared by the agent,
// its control planes and the gRPC client (no gRPC here).

#include <cstdint>
#include <string>

namespace ddp {

struct NodeInfo {
  int node_rank = -1;  // -1: let the server assign
  int local_world_size = 1;
  std::string hostname;
  std::string address;
  int master_port = 0;
};

struct RoundAssignment {
  std::int64_t round = 0;
  int group_rank = 0;
  int group_world_size = 1;
  int world_size = 1;
  int global_rank_offset = 0;
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;
};

struct RoundStatus {
  bool round_ended = false;
  bool succeeded = false;  // ended because every node finished with exit code 0
  bool can_restart = false;
  std::string reason;
};

}  // namespace ddp
