#pragma once
// Plain types of the rendezvous membership protocol, shared by the agent,
// its control planes and the gRPC client (no gRPC here).

#include <cstdint>
#include <functional>
#include <string>

#include "ddp/common/error.h"

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
  std::string reason;  // why the previous round ended; empty for the first round
  // This node's id in the round: its heartbeats, leave and failure reports
  // carry it, so that the server tells it from a node that took its place.
  std::uint64_t member = 0;
  // Admitted into the running round (--on_failure=heal), in a lost node's
  // place or as one more node: its workers start as relaunches and heal
  // from the live ranks instead of starting the job afresh.
  bool joined_running = false;
};

// The rendezvous store's key a libddp program sets under
// --on_failure=heal once its first group of round `round` formed: that
// round's program heals in process, so the rendezvous may admit a new node
// into the running round instead of restarting it.
inline std::string healing_round_key(std::int64_t round) {
  return "ddprun/heal/round" + std::to_string(round);
}

// Under --on_failure=heal the rendezvous counts the nodes it leaves out of
// round `round` (heartbeats stopped, or a new agent took the node's place)
// under lost_nodes_key(round), and the k-th (from 1) is described under
// lost_node_key(round, k) as "<GROUP_RANK> <why>": libddp's groups stop
// waiting on the ranks of such a node at once, not at their timeout (a
// machine that died with its link closes no connection).
inline std::string lost_nodes_key(std::int64_t round) { return healing_round_key(round) + "/lost"; }
inline std::string lost_node_key(std::int64_t round, std::int64_t k) {
  return lost_nodes_key(round) + "/" + std::to_string(k);
}

// Under --on_failure=heal across nodes, the agent that saw its worker of
// launch rank `rank` exit sets exited_rank_key(round, rank) to that
// worker's pid (the newest death of that rank): ranks on other machines,
// which cannot look its pid up, then know at once that it is gone.
inline std::string exited_rank_key(std::int64_t round, int rank) {
  return healing_round_key(round) + "/exited/" + std::to_string(rank);
}

// How a round stands, as a heartbeat hears it.
struct RoundStatus {
  bool round_ended = false;  // stop the workers
  bool succeeded = false;    // ended because every node finished with exit code 0
  bool can_restart = false;  // a new round will be formed: join again
  std::string reason;        // why it ended (the first failure); empty on success
};

// The store's compare-and-set (torch's TCPStore semantics).
struct CompareSetOutcome {
  bool swapped = false;
  std::string current;  // the value after the call; empty when the key is missing
};

// A join given up because the caller was interrupted (a signal): the server
// has withdrawn the node. The message says what the join was waiting for.
class JoinInterrupted : public Error {
 public:
  explicit JoinInterrupted(const std::string& message) : Error(message) {}
};

// How a blocking join may be cut short. Whenever `fd` is readable,
// `interrupted()` is called; true cancels the join (JoinInterrupted).
// `notice` (optional) receives one line when the server has not been
// reachable for a few seconds.
struct JoinWait {
  int fd = -1;
  std::function<bool()> interrupted;
  std::function<void(const std::string&)> notice;
};

}  // namespace ddp
