// Gloo leaves a send whose bytes are already moving waiting for the whole
// collective timeout when its receiver dies; libddp's Gloo backend ends that
// wait once the receiver is known gone. Two ranks started by hand (no ddprun
// to stop the job): rank 1 stops mid-broadcast, with rank 0's socket full,
// and is then SIGKILLed.

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>
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

TEST(GlooStall, ASendUnderWayToARankThatDiedFailsNamingItNotAfterTheTimeout) {
  // Rank 1 may receive every byte before it can stop (a fast machine): try again.
  for (int attempt = 1; attempt <= 3; ++attempt) {
    const std::string run_id = "stall" + std::to_string(getpid()) + "-" + std::to_string(attempt);
    StandaloneStore store(kDdprun, run_id);
    ASSERT_FALSE(store.endpoint.empty()) << store.daemon.read_err();
    std::vector<std::unique_ptr<Subprocess>> ranks;
    for (int rank = 0; rank < 2; ++rank) {
      ranks.push_back(std::make_unique<Subprocess>(
          std::vector<std::string>{kWorker},
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
    ASSERT_TRUE(
        wait_until([&] { return stopped(receiver.pid()) || !process_alive(receiver.pid()); }, 30s))
        << receiver.read_out() << receiver.read_err() << sender.read_err();
    if (receiver.read_out().find("TRANSFER DONE BEFORE STOP") != std::string::npos) {
      kill(sender.pid(), SIGKILL);
      continue;
    }
    ASSERT_NE(receiver.read_out().find("STOPPED MID-TRANSFER"), std::string::npos)
        << receiver.read_out() << receiver.read_err();
    kill(receiver.pid(), SIGKILL);
    const auto killed = std::chrono::steady_clock::now();
    auto r = sender.wait(30s);
    const auto waited = std::chrono::steady_clock::now() - killed;
    ASSERT_TRUE(r.exited) << "rank 0 still waits 30 s after rank 1 died\n" << r.err;
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_LT(waited, 10s) << "rank 0 waited for its timeout (60 s)\n" << r.out;
    EXPECT_NE(r.out.find("rank 1 (pid " + std::to_string(receiver.pid()) + ") exited"),
              std::string::npos)
        << r.out << r.err;
    return;
  }
  FAIL() << "in 3 attempts rank 1 never stopped before the broadcast's last byte";
}

}  // namespace
}  // namespace ddp::testing
