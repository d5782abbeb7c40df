// Stragglers named live, end to end: the reference trainer on two ranks, one
// of them stopped for 20% of the time (SIGSTOP/SIGCONT pulses from the
// test); ddprun must name that rank in a warning, the event log, the metrics
// and `ddprun status`, and say when it has recovered once the pulses stop;
// on two nodes, `ddprun status` at the rendezvous shows the other node's;
// on two hosts of one rank each (network namespaces; root, else skipped),
// the rendezvous names the slow host's node, which no agent alone can.

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "netns_hosts.h"
#include "netns_test.h"
#include "subprocess.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
const std::string kDdprun = DDPRUN_PATH;
const std::string kTrain = TRAIN_PATH;

// The pid of `rank` in `ddprun status --json`, or -1.
pid_t pid_of(const std::string& json, int rank) {
  std::smatch m;
  const std::regex re("\"rank\":" + std::to_string(rank) + ",\"local_rank\":\\d+,\"pid\":(\\d+)");
  return std::regex_search(json, m, re) ? std::stoi(m[1]) : -1;
}

// Polls `status` (one `ddprun status --json`) until `rank` shows as a libddp
// rank; its pid, or -1 after 30 s. `last`: the last answer.
pid_t libddp_rank_pid(const std::function<ProcessResult()>& status, int rank, ProcessResult& last) {
  pid_t pid = -1;
  const bool seen = wait_until(
      [&] {
        last = status();
        pid = pid_of(last.out, rank);
        return last.code == 0 && pid > 0 && last.out.find("\"libddp\":true") != std::string::npos;
      },
      30s);
  return seen ? pid : -1;
}

// Stops `pid` for `stop` out of every `period` until destroyed.
class Pulses {
 public:
  Pulses(pid_t pid, std::chrono::milliseconds stop, std::chrono::milliseconds period)
      : thread_([=, this] {
          while (!done_) {
            kill(pid, SIGSTOP);
            std::this_thread::sleep_for(stop);
            kill(pid, SIGCONT);
            std::this_thread::sleep_for(period - stop);
          }
        }) {}
  ~Pulses() {
    done_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

TEST(Stragglers, ARankStoppedTwentyPercentOfTheTimeIsNamedAndRecovers) {
  const std::string dir = make_temp_dir();
  const std::map<std::string, std::string> env = {{"XDG_RUNTIME_DIR", dir}};
  const std::string events = dir + "/events.jsonl";
  const int port = free_port();
  Subprocess job({kDdprun, "--nproc_per_node=2", "--run_id=strag", "--events_file=" + events,
                  "--metrics_port=" + std::to_string(port), "--straggler_window=20", kTrain,
                  "--epochs", "100000", "--log_every", "1000000"},
                 env);
  ProcessResult st;
  const pid_t victim = libddp_rank_pid(
      [&] {
        return run_process({kDdprun, "status", "--json"}, env, 10s);
      },
      1, st);
  ASSERT_GT(victim, 0) << st.out << st.err;
  {
    Pulses pulses(victim, 60ms, 300ms);
    // Named within the target (60 s); a 20 s window needs 10 s of samples.
    ASSERT_TRUE(wait_until(
        [&] { return job.read_err().find("straggler: rank 1 arrived last") != std::string::npos; },
        60s))
        << job.read_err();
    st = run_process({kDdprun, "status", "--json"}, env, 10s);
    EXPECT_NE(st.out.find("\"rank\":1,\"local_rank\":1,\"pid\":" + std::to_string(victim)),
              std::string::npos);
    // Rank 1 and only it.
    const std::regex flag("\"straggler\":true");
    const auto flagged =
        std::distance(std::sregex_iterator(st.out.begin(), st.out.end(), flag), {});
    EXPECT_EQ(flagged, 1) << st.out;
    EXPECT_TRUE(std::regex_search(
        st.out, std::regex("\"rank\":1,[^}]*\"straggler_score\":0\\.[0-9]+,\"straggler\":true")))
        << st.out;
    ProcessResult table = run_process({kDdprun, "status"}, env, 10s);
    const auto rank1 = lines_with_prefix(table.out, "  1 ");
    ASSERT_EQ(rank1.size(), 1u) << table.out;
    EXPECT_NE(rank1[0].find("% STRAGGLER"), std::string::npos) << table.out;
    for (const auto& line : lines_with_prefix(table.out, "  0 ")) {
      EXPECT_EQ(line.find("STRAGGLER"), std::string::npos) << table.out;
    }
    const std::string metrics = http_get(port, "/metrics");
    EXPECT_TRUE(std::regex_search(
        metrics, std::regex("ddprun_rank_straggler\\{[^}]*rank=\"1\"[^}]*\\} 1\n")))
        << metrics;
    EXPECT_TRUE(std::regex_search(
        metrics, std::regex("ddprun_rank_straggler_score\\{[^}]*rank=\"1\"[^}]*\\} 0\\.[0-9]")))
        << metrics;
    EXPECT_NE(metrics.find("ddprun_stragglers_named_total{"), std::string::npos) << metrics;
  }
  EXPECT_EQ(job.read_err().find("straggler: rank 0 "), std::string::npos) << job.read_err();
  // The pulses have stopped: the verdict is withdrawn about a window later.
  EXPECT_TRUE(wait_until(
      [&] { return job.read_err().find("straggler recovered: rank 1 ") != std::string::npos; },
      40s))
      << job.read_err();
  kill(job.pid(), SIGTERM);
  job.wait(30s);
  const std::string log = read_file(events);
  EXPECT_TRUE(std::regex_search(
      log, std::regex("\"name\":\"straggler\"[^\n]*\"global_rank\":1[^\n]*\"state\":\"NAMED\"[^\n]*"
                      "\"message\":\"rank 1 arrived last in")))
      << log;
  EXPECT_TRUE(std::regex_search(
      log,
      std::regex("\"name\":\"straggler\"[^\n]*\"global_rank\":1[^\n]*\"state\":\"RECOVERED\"")))
      << log;
  std::filesystem::remove_all(dir);
}

// Two nodes: the slow rank's own agent names it, and `ddprun status` asked
// at the rendezvous shows it from the node's report.
TEST(Stragglers, ASlowRankOnTheOtherNodeIsShownThroughTheRendezvous) {
  const std::string ep = "127.0.0.1:" + std::to_string(free_port());
  const std::map<std::string, std::string> token = {{"DDP_RDZV_TOKEN", "strag-secret"}};
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int rank = 0; rank < 2; ++rank) {
    nodes.push_back(std::make_unique<Subprocess>(
        std::vector<std::string>{
            kDdprun, "--nnodes=2", "--nproc_per_node=2", "--node_rank=" + std::to_string(rank),
            "--rdzv_backend=c10d", "--rdzv_endpoint=" + ep, "--run_id=strag2",
            "--rdzv_conf=heartbeat_interval=0.5,heartbeat_timeout=10", "--straggler_window=20",
            kTrain, "--epochs", "100000", "--log_every", "1000000"},
        token));
  }
  ProcessResult st;
  const pid_t victim = libddp_rank_pid(
      [&] {
        return run_process({kDdprun, "status", ep, "--json"}, token, 10s);
      },
      3, st);
  ASSERT_GT(victim, 0) << st.out << st.err;
  {
    Pulses pulses(victim, 60ms, 300ms);
    EXPECT_TRUE(wait_until(
        [&] {
          st = run_process({kDdprun, "status", ep, "--json"}, token, 10s);
          return std::regex_search(st.out, std::regex("\"rank\":3,[^}]*\"straggler\":true"));
        },
        60s))
        << st.out;
  }
  const std::regex flag("\"straggler\":true");
  EXPECT_EQ(std::distance(std::sregex_iterator(st.out.begin(), st.out.end(), flag), {}), 1)
      << st.out;
  EXPECT_NE(nodes[1]->read_err().find("straggler: rank 3 arrived last"), std::string::npos)
      << nodes[1]->read_err();
  for (auto& n : nodes) kill(n->pid(), SIGTERM);
  for (auto& n : nodes) n->wait(30s);
}

class StragglerMultiHost : public NetnsTest {};

TEST_F(StragglerMultiHost, TheOnlyRankOfASlowHostIsNamedAtTheRendezvous) {
  NetnsHosts hosts(2);
  const std::string dir = make_temp_dir();
  const std::string events = dir + "/events.jsonl";
  const std::string ep = hosts.address(0) + ":29500";
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int h = 0; h < 2; ++h) {
    nodes.push_back(std::make_unique<Subprocess>(
        hosts.on(h,
                 {kDdprun, "--nnodes=2", "--node_rank=" + std::to_string(h),
                  "--master_addr=" + hosts.address(0), "--master_port=29500", "--nproc_per_node=1",
                  "--straggler_window=20", "--events_file=" + events + std::to_string(h), kTrain,
                  "--batch_size", "2048", "--epochs", "100000", "--log_every", "1000000"}),
        std::map<std::string, std::string>{{"DDP_BACKEND", "gloo"},
                                           {"GLOO_SOCKET_IFNAME", "eth0"}}));
  }
  auto status = [&] {
    return run_process(hosts.on(0, {kDdprun, "status", ep, "--json"}), {}, 10s);
  };
  ProcessResult st;
  const pid_t victim = libddp_rank_pid(status, 1, st);
  ASSERT_GT(victim, 0) << st.out << st.err << nodes[0]->read_err();
  {
    Pulses pulses(victim, 60ms, 300ms);
    // Named within the target (60 s); a 20 s window needs 10 s of intervals.
    EXPECT_TRUE(wait_until(
        [&] {
          st = status();
          return std::regex_search(st.out, std::regex("\"node_rank\":1,[^\\[]*\"straggler\":true"));
        },
        60s))
        << st.out << nodes[0]->read_err();
  }
  EXPECT_TRUE(std::regex_search(st.out, std::regex("\"node_rank\":0,[^\\[]*\"straggler\":false")))
      << st.out;
  // The host of the rendezvous says which node, host and rank, and why.
  const std::string log = nodes[0]->read_err();
  EXPECT_TRUE(std::regex_search(log, std::regex("straggler: node 1 \\(host [^,]+, ranks 1\\) "
                                                "arrived last in [0-9]+ of the last [0-9]+ "
                                                "intervals")))
      << log;
  EXPECT_EQ(log.find("straggler: node 0"), std::string::npos) << log;
  // The host of the rendezvous records it as an event (at its next sample).
  std::string recorded;
  EXPECT_TRUE(wait_until(
      [&] {
        recorded = read_file(events + "0");
        return std::regex_search(recorded,
                                 std::regex("\"name\":\"straggler\"[^\n]*\"state\":\"NAMED\"[^\n]*"
                                            "\"message\":\"node 1 \\(host "));
      },
      10s))
      << recorded;
  for (auto& n : nodes) kill(n->pid(), SIGTERM);
  for (auto& n : nodes) n->wait(30s);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ddp::testing
