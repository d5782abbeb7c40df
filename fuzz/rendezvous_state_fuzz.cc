// libFuzzer target: RendezvousState driven by an arbitrary sequence of
// requests (joins, polls, cancellations, heartbeats, failures, leaves, store
// calls, barriers, time steps), from right and wrong callers, with small
// limits so that every refusal path is reached. After every request the
// state's own invariants must hold, and every join answer must fit the
// others of its round (distinct group ranks, disjoint global rank ranges
// inside the world size). Built and run by scripts/fuzz.sh (clang, with
// AddressSanitizer and UndefinedBehaviorSanitizer).

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "rendezvous/rendezvous_state.h"
#include "small_limits.h"

namespace {

using namespace ddp::launcher;
using namespace std::chrono_literals;

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "rendezvous_state_fuzz: %s\n", why.c_str());
  std::abort();
}

struct RoundSeen {
  int world_size = -1;
  int group_world_size = -1;
  // Group rank -> [offset, offset + local world size) and whether a node took
  // that place in the running round (heal: a place may then be answered twice).
  std::map<int, std::pair<std::pair<int, int>, bool>> places;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  RendezvousConfig config;
  config.run_id = "run";
  config.token = in.ConsumeBool() ? "secret" : "";
  config.min_nodes = in.ConsumeIntegralInRange(1, 3);
  config.max_nodes = in.ConsumeIntegralInRange(config.min_nodes, 4);
  config.max_restarts = in.ConsumeIntegralInRange(0, 3);
  config.join_timeout = std::chrono::milliseconds(in.ConsumeIntegralInRange(1, 2000));
  config.last_call_timeout = std::chrono::milliseconds(in.ConsumeIntegralInRange(0, 500));
  config.heartbeat_timeout = std::chrono::milliseconds(in.ConsumeIntegralInRange(1, 1000));
  config.heal = in.ConsumeBool();  // silent nodes lost instead of ending the round
  config.limits = small_fuzz_limits();
  RendezvousState state(config);

  TimePoint now{};
  const Auth right{config.run_id, config.token};
  std::vector<std::pair<JoinTicket, int>> joins;  // ticket, local world size
  std::vector<BarrierTicket> arrivals;
  std::map<std::int64_t, RoundSeen> rounds;
  std::set<std::uint64_t> members;
  // The last: a program of round 1 that heals (nodes may then join it running).
  const char* const keys[] = {
      "a", "b", "pg/x", "", "a-key-longer-than-24-bytes", "ddprun/heal/round1"};
  const char* const hosts[] = {"h0", "h1", "h2", "h3"};

  while (in.remaining_bytes() > 0) {
    Auth auth = right;
    switch (in.ConsumeIntegralInRange(0, 7)) {  // mostly the right caller
      case 0:
        auth.token = "wrong";
        break;
      case 1:
        auth.run_id = "other";
        break;
      default:
        break;
    }
    auto pick = [&](auto& list) {
      return in.ConsumeIntegralInRange<std::size_t>(0, list.size() - 1);
    };
    const std::string key = keys[in.ConsumeIntegralInRange(0, 5)];
    const std::int64_t round =
        in.ConsumeIntegralInRange<std::int64_t>(-1, state.current_round() + 1);
    const int rank = in.ConsumeIntegralInRange(-1, 4);
    // Which node a membership call speaks as: none claimed, or an id handed out.
    std::uint64_t member = 0;
    if (!members.empty() && in.ConsumeBool()) {
      member = *std::next(members.begin(),
                          static_cast<std::ptrdiff_t>(
                              in.ConsumeIntegralInRange<std::size_t>(0, members.size() - 1)));
    }
    try {
      switch (in.ConsumeIntegralInRange(0, 17)) {
        case 0: {
          ddp::NodeInfo args;
          args.node_rank = in.ConsumeIntegralInRange(-2, 4);
          args.local_world_size = in.ConsumeIntegralInRange(0, 4);
          const int host = in.ConsumeIntegralInRange(0, 3);
          args.hostname = hosts[host];
          args.address = in.ConsumeBool() ? std::string(hosts[host]) + ".addr" : "";
          args.master_port = in.ConsumeIntegralInRange(0, 3);
          joins.emplace_back(state.join(auth, args, now), args.local_world_size);
          break;
        }
        case 1: {
          if (joins.empty()) break;
          const std::size_t i = pick(joins);
          std::optional<ddp::RoundAssignment> answer;
          try {
            answer = state.join_status(joins[i].first, now);
            if (!answer) break;  // still pending
          } catch (const ddp::RpcError&) {
            // refused: the ticket is consumed all the same
          }
          if (answer) {
            const ddp::RoundAssignment& j = *answer;
            RoundSeen& seen = rounds[j.round];
            // A node that joined the running round may have grown it (heal):
            // its sizes are at least those the round formed with.
            if (seen.world_size < 0 && !j.joined_running) {
              seen.world_size = j.world_size;
              seen.group_world_size = j.group_world_size;
            }
            if (seen.world_size >= 0 &&
                (j.joined_running ? (j.world_size < seen.world_size ||
                                     j.group_world_size < seen.group_world_size)
                                  : (seen.world_size != j.world_size ||
                                     seen.group_world_size != j.group_world_size))) {
              fail("round " + std::to_string(j.round) +
                   ": answers disagree on the world or group size");
            }
            const int lo = j.global_rank_offset, hi = lo + joins[i].second;
            if (j.group_rank < 0 || j.group_rank >= j.group_world_size)
              fail("round " + std::to_string(j.round) + ": group rank " +
                   std::to_string(j.group_rank) + " out of range");
            if (lo < 0 || hi > j.world_size)
              fail("global ranks [" + std::to_string(lo) + ", " + std::to_string(hi) +
                   ") outside the world");
            if (j.member == 0 || !members.insert(j.member).second)
              fail("member id " + std::to_string(j.member) + " zero or repeated");
            auto [place, fresh] = seen.places.try_emplace(
                j.group_rank, std::make_pair(std::make_pair(lo, hi), j.joined_running));
            if (!fresh) {
              // Only a node that took a lost place repeats one, with its ranks.
              if (!(j.joined_running || place->second.second) ||
                  place->second.first != std::make_pair(lo, hi))
                fail("round " + std::to_string(j.round) + ": group rank " +
                     std::to_string(j.group_rank) + " repeated");
              place->second.second = true;
            }
            for (const auto& [g, other] : seen.places) {
              const auto [a, b] = other.first;
              if (g != j.group_rank && lo < b && a < hi)
                fail("round " + std::to_string(j.round) + ": global rank ranges overlap");
            }
          }
          joins.erase(joins.begin() + static_cast<std::ptrdiff_t>(i));
          break;
        }
        case 2:
          if (!joins.empty()) {
            const std::size_t i = pick(joins);
            state.cancel(joins[i].first);
            joins.erase(joins.begin() + static_cast<std::ptrdiff_t>(i));
          }
          break;
        case 3:
          state.heartbeat(auth, round, rank, now, in.ConsumeBool(), member);
          break;
        case 4:
          state.report_failure(auth, round, rank, in.ConsumeRandomLengthString(64),
                               in.ConsumeIntegral<int>(), now, member);
          break;
        case 5:
          state.leave(auth, round, rank, in.ConsumeIntegralInRange(0, 2), now, member);
          break;
        // The arguments are read from the input before store() may refuse the
        // caller, so that an input means what it meant before.
        case 6: {
          const std::string value(in.ConsumeIntegralInRange(0, 80), 'v');
          state.store(auth).set(key, value);
          break;
        }
        case 7:
          state.store(auth).get(key);
          break;
        case 8: {
          const auto delta = in.ConsumeIntegral<std::int64_t>();
          state.store(auth).add(key, delta);
          break;
        }
        case 9: {
          const std::string expected = in.ConsumeRandomLengthString(8);
          const std::string desired = in.ConsumeRandomLengthString(80);
          state.store(auth).compare_set(key, expected, desired);
          break;
        }
        case 10:
          state.store(auth).remove(key);
          break;
        case 11:
          state.store(auth).check({key, "a"});
          break;
        case 12: {
          const std::string name = in.ConsumeBool() ? "b0" : (in.ConsumeBool() ? "b1" : "b2");
          const int world = in.ConsumeIntegralInRange(0, 5);
          const TimePoint deadline =
              now + std::chrono::milliseconds(in.ConsumeIntegralInRange(0, 500));
          const std::string host = hosts[in.ConsumeIntegralInRange(0, 3)];
          arrivals.push_back(
              state.barriers(auth, now).arrive(name, rank, world, host, deadline, now));
          break;
        }
        case 13:
          if (!arrivals.empty()) {
            const std::size_t i = pick(arrivals);
            bool final = true;  // passed, or refused (which consumes the ticket too)
            try {
              final = state.barriers(right, now).passed(arrivals[i]);
            } catch (const ddp::RpcError&) {
            }
            if (final) arrivals.erase(arrivals.begin() + static_cast<std::ptrdiff_t>(i));
          }
          break;
        case 14:
          if (!arrivals.empty()) {
            const std::size_t i = pick(arrivals);
            state.cancel(arrivals[i]);
            arrivals.erase(arrivals.begin() + static_cast<std::ptrdiff_t>(i));
          }
          break;
        case 15:
          now += std::chrono::milliseconds(in.ConsumeIntegralInRange(0, 400));
          state.tick(now);
          break;
        case 16:
          state.round_end(round, rank, now, member);
          break;
        case 17:
          state.store(auth).size();
          break;
      }
    } catch (const ddp::RpcError&) {
      // A refusal is an answer; what must hold is checked below either way.
    }
    if (std::string why = state.broken_invariant(); !why.empty()) fail(why);
  }
  return 0;
}
