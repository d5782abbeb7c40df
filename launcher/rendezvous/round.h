#pragma once
// A round's nodes as the parts of RendezvousState keep them (internal to
// rendezvous/): FormingRound gathers Members, RoundFormation turns them into
// Rounds, NodeLiveness records what each node says or stops saying.

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/common/rendezvous_types.h"
#include "rendezvous/limits.h"
#include "rendezvous/messages.h"
#include "rendezvous/rendezvous_config.h"

namespace ddp::launcher {

struct Member {
  NodeInfo args;
  std::uint64_t arrival = 0;  // join order; breaks ties between auto ranks
  std::uint64_t ticket = 0;   // its join ticket, and its RoundAssignment::member
  TimePoint last_seen{};
  bool left = false;
  bool informed = false;  // heard how its round ended, or is gone (nobody to tell)
  bool lost = false;      // left out of its running round after its heartbeats stopped (heal)
};

struct Round {
  std::vector<Member> members;  // indexed by group rank
  RoundAssignment common;       // what every node's assignment shares (master, sizes)
  bool ended = false;
  bool succeeded = false;
  bool can_restart = false;
  std::string reason;
};

// "node 1 (host 'x')".
inline std::string describe_node(const Round& round, int group_rank) {
  return cat("node ", group_rank, " (host ", quote(host_of(round.members[group_rank].args)), ")");
}

// "--nnodes=2", or "--nnodes=1:4" for an elastic job.
inline std::string nnodes_flag(const RendezvousConfig& config) {
  const int lo = config.min_nodes, hi = config.max_nodes;
  return lo == hi ? cat("--nnodes=", lo) : cat("--nnodes=", lo, ":", hi);
}

}  // namespace ddp::launcher
