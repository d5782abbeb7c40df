#pragma once
// The hand-driven RendezvousState of the state tests: a fake clock, tickets
// polled as the gRPC service polls them, and readable refusals.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "ddp/common/error.h"
#include "rendezvous/rendezvous_state.h"

namespace ddp {
// Readable gtest failures for the enums.
inline void PrintTo(RpcCode code, std::ostream* os) {
  *os << rpc_code_name(static_cast<int>(code));
}
}  // namespace ddp

namespace ddp::launcher {

inline void PrintTo(RendezvousState::Phase phase, std::ostream* os) {
  static const char* const names[] = {"kForming", "kRunning", "kSucceeded", "kFailed"};
  *os << names[static_cast<int>(phase)];
}

namespace rendezvous_test {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

inline const Auth kAuth{"run1", "secret"};

// How a call that must be refused was refused: the code and message of the
// RpcError it threw. A call that returns instead fails the test.
struct Refusal {
  RpcCode code = RpcCode::kOk;
  std::string message;
  std::string reason;
};
template <class Call>
Refusal refused(Call&& call) {
  try {
    call();
  } catch (const RpcError& e) {
    return {static_cast<RpcCode>(e.code()), e.what(), e.reason()};
  }
  ADD_FAILURE() << "the call was not refused";
  return {};
}

inline RendezvousConfig make_config(int min_nodes, int max_nodes, int max_restarts = 0) {
  RendezvousConfig c;
  c.run_id = "run1";
  c.token = "secret";
  c.min_nodes = min_nodes;
  c.max_nodes = max_nodes;
  c.max_restarts = max_restarts;
  return c;
}

inline NodeInfo node(const std::string& host, int local_world_size = 1, int node_rank = -1) {
  return NodeInfo{node_rank, local_world_size, host, host + ".addr", 29500};
}

class RendezvousStateTest : public ::testing::Test {
 protected:
  void advance(std::chrono::milliseconds d) { now += d; }

  // A refusal fails the test (as every exception in a test body does).
  JoinTicket join(RendezvousState& s, const NodeInfo& args) { return s.join(kAuth, args, now); }
  // The refusal a ticket ends with; one still pending or answered fails the test.
  Refusal join_refusal(RendezvousState& s, JoinTicket t) {
    return refused(
        [&] { EXPECT_TRUE(s.join_status(t, now).has_value()) << "join ticket still pending"; });
  }
  // The node's place; a ticket still pending fails the test.
  RoundAssignment joined(RendezvousState& s, JoinTicket t) {
    auto r = s.join_status(t, now);
    EXPECT_TRUE(r.has_value()) << "join ticket still pending";
    return r.value_or(RoundAssignment{});
  }
  // Forms a round of `n` single-worker nodes host0..host{n-1} (ranks in order).
  void form(RendezvousState& s, int n) {
    std::vector<JoinTicket> tickets;
    for (int i = 0; i < n; ++i) tickets.push_back(join(s, node("host" + std::to_string(i))));
    for (auto t : tickets) joined(s, t);
    ASSERT_EQ(s.phase(), RendezvousState::Phase::kRunning);
  }
  BarrierTicket arrive(RendezvousState& s, const std::string& name, int rank, int world,
                       std::chrono::milliseconds timeout = 10s) {
    return s.barriers(kAuth, now)
        .arrive(name, rank, world, "h" + std::to_string(rank), now + timeout, now);
  }

  TimePoint now = TimePoint{} + 1000h;
};

}  // namespace rendezvous_test
}  // namespace ddp::launcher
