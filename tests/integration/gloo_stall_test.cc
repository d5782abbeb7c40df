// Gloo leaves a send whose bytes are already moving waiting for the whole
// collective timeout when its receiver dies or leaves; libddp's Gloo backend
// ends that wait once the receiver is known gone. Two ranks started by hand
// (no ddprun to stop the job): rank 1 stops mid-broadcast, with rank 0's
// socket full, and is then SIGKILLed; or it leaves the group and lives on.

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "standalone_store.h"
#include "subprocess.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
const std::string kDdprun = DDPRUN_PATH;
const std::string kWorker = GLOO_STALL_WORKER_PATH;

bool stopped(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close_paren = stat.rfind(')');
  return close_paren != std::string::npos && close_paren + 2 < stat.size() &&
         stat[close_paren + 2] == 'T';
}

// Rank 0 and rank 1 started by hand on gloo; rank 1 stops or leaves
// (gloo_stall_worker's `how`) while rank 0's broadcast to it is under way.
// Returns rank 0's result and how long it took after `then` (run on rank 1,
// then stopped or left), or nullopt when rank 1 got every byte first (3 tries).
struct Stalled {
  ProcessResult sender;
  std::chrono::steady_clock::duration after;
  pid_t receiver;
};
std::optional<Stalled> stall(const std::string& how, const std::function<void(pid_t)>& then) {
  for (int attempt = 1; attempt <= 3; ++attempt) {
    const std::string run_id = "stall" + std::to_string(getpid()) + "-" + std::to_string(attempt);
    StandaloneStore store(kDdprun, run_id);
    EXPECT_FALSE(store.endpoint.empty()) << store.daemon.read_err();
    if (store.endpoint.empty()) return std::nullopt;
    std::vector<std::unique_ptr<Subprocess>> ranks;
    for (int rank = 0; rank < 2; ++rank) {
      ranks.push_back(std::make_unique<Subprocess>(
          std::vector<std::string>{kWorker, how},
          std::map<std::string, std::string>{{"RANK", std::to_string(rank)},
                                             {"WORLD_SIZE", "2"},
                                             {"DDP_BACKEND", "gloo"},
                                             {"DDP_RDZV_ENDPOINT", store.endpoint},
                                             {"DDP_RUN_ID", run_id},
                                             {"DDP_RDZV_TOKEN", "t"},
                                             {"DDP_TIMEOUT_S", "60"}}));
    }
    Subprocess& sender = *ranks[0];
    Subprocess& receiver = *ranks[1];
    const std::string mark = how == "stop" ? "STOPPED MID-TRANSFER" : "LEFT MID-TRANSFER";
    const bool marked = wait_until(
        [&] {
          const std::string out = receiver.read_out();
          return out.find(mark) != std::string::npos ||
                 out.find("TRANSFER DONE BEFORE STOP") != std::string::npos ||
                 !process_alive(receiver.pid());
        },
        30s);
    EXPECT_TRUE(marked) << receiver.read_out() << receiver.read_err() << sender.read_err();
    if (!marked) return std::nullopt;
    if (receiver.read_out().find("TRANSFER DONE BEFORE STOP") != std::string::npos) continue;
    EXPECT_NE(receiver.read_out().find(mark), std::string::npos)
        << receiver.read_out() << receiver.read_err();
    then(receiver.pid());
    const auto at = std::chrono::steady_clock::now();
    Stalled result{sender.wait(30s), {}, receiver.pid()};
    result.after = std::chrono::steady_clock::now() - at;
    kill(receiver.pid(), SIGKILL);
    return result;
  }
  ADD_FAILURE() << "in 3 attempts rank 1 never stopped before the broadcast's last byte";
  return std::nullopt;
}

TEST(GlooStall, ASendUnderWayToARankThatDiedFailsNamingItNotAfterTheTimeout) {
  auto stalled = stall("stop", [](pid_t receiver) {
    ASSERT_TRUE(wait_until([&] { return stopped(receiver); }, 10s));
    kill(receiver, SIGKILL);
  });
  ASSERT_TRUE(stalled);
  const ProcessResult& r = stalled->sender;
  ASSERT_TRUE(r.exited) << "rank 0 still waits 30 s after rank 1 died\n" << r.err;
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_LT(stalled->after, 10s) << "rank 0 waited for its timeout (60 s)\n" << r.out;
  EXPECT_NE(r.out.find("rank 1 (pid " + std::to_string(stalled->receiver) + ") exited"),
            std::string::npos)
      << r.out << r.err;
}

// Rank 1 leaves (as a healing survivor does) but lives on: its pid says
// nothing, the group's store does.
TEST(GlooStall, ASendUnderWayToARankThatLeftTheGroupFailsNamingIt) {
  auto stalled = stall("abort", [](pid_t) {});
  ASSERT_TRUE(stalled);
  const ProcessResult& r = stalled->sender;
  ASSERT_TRUE(r.exited) << "rank 0 still waits 30 s after rank 1 left\n" << r.err;
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_LT(stalled->after, 10s) << "rank 0 waited for its timeout (60 s)\n" << r.out;
  EXPECT_NE(r.out.find("rank 1 left the group"), std::string::npos) << r.out << r.err;
}

}  // namespace
}  // namespace ddp::testing
