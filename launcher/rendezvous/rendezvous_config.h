#pragma once
// What configures a rendezvous, and the small types its parts share. The
// contract of the rendezvous is RendezvousState's (rendezvous_state.h).

#include <chrono>
#include <cstdint>
#include <string>

#include "rendezvous/limits.h"

namespace ddp::launcher {

struct RendezvousConfig {
  std::string run_id;
  std::string token;
  int min_nodes = 1;  // --nnodes=MIN:MAX; equal for a fixed size
  int max_nodes = 1;
  std::chrono::milliseconds join_timeout{std::chrono::seconds(600)};
  // torchrun's default: late elastic nodes get 30 s to join once MIN are in.
  std::chrono::milliseconds last_call_timeout{std::chrono::seconds(30)};
  std::chrono::milliseconds heartbeat_timeout{std::chrono::seconds(30)};
  int max_restarts = 0;  // job-wide
  // --on_failure=heal: a node silent for heartbeat_timeout is left out of the
  // running round instead of ending it, which goes on while at least
  // min_nodes remain (its workers heal without the lost node's ranks).
  bool heal = false;
  RendezvousLimits limits;
};

// The store's count of single relaunches under heal, job-wide: the agents
// add one per rank they relaunch, the server one per node it admits into a
// running round; together at most max_restarts.
inline constexpr const char* kHealRelaunchesKey = "ddprun/heal/relaunches";

struct JoinTicket {
  std::uint64_t id = 0;
};

// Where the job stands (RendezvousState::Phase).
enum class RendezvousPhase {
  kForming,    // accepting joins (before the first round, or after a restartable failure)
  kRunning,    // the last round formed and has not ended
  kSucceeded,  // every node of the last round left with exit code 0
  kFailed,     // the last round failed with no restarts left
};

}  // namespace ddp::launcher
