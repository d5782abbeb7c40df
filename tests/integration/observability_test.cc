// ddprun's observability end to end, with real ddprun processes, real
// sockets and, when installed, a real Prometheus server: `ddprun status`
// (local jobs through the runtime directory, two nodes through the
// rendezvous, bad tokens, endpoints and foreign servers), --metrics_port
// (promtool, a Prometheus scrape and PromQL query, a port in use) and
// --events_file (the records of a restart, a full disk).

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>

#include "netns_test.h"
#include "subprocess.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
const std::string kDdprun = DDPRUN_PATH;
const std::string kTrain = TRAIN_PATH;

// A long enough training run (stopped by the test).
std::vector<std::string> train_args() {
  return {kTrain, "--epochs", "100000", "--log_every", "50"};
}

std::string find_tool(const std::string& tool) {
  for (const std::string dir : {"/usr/bin/", "/usr/local/bin/", "/bin/"}) {
    if (access((dir + tool).c_str(), X_OK) == 0) return dir + tool;
  }
  return "";
}

// Waits until `ddprun status` run with `env` and `args` shows `needle`.
ProcessResult status_until(const std::vector<std::string>& args,
                           const std::map<std::string, std::string>& env,
                           const std::string& needle) {
  ProcessResult last;
  wait_until(
      [&] {
        std::vector<std::string> argv = {kDdprun, "status"};
        argv.insert(argv.end(), args.begin(), args.end());
        last = run_process(argv, env, 10s);
        return last.code == 0 && last.out.find(needle) != std::string::npos;
      },
      30s);
  return last;
}

TEST(Status, LocalJobShowsEveryRankThroughTheRuntimeDirectory) {
  const std::string runtime = make_temp_dir();
  const std::map<std::string, std::string> env = {{"XDG_RUNTIME_DIR", runtime}};
  std::vector<std::string> argv = {kDdprun, "--nproc_per_node=2", "--run_id=obs-local"};
  auto train = train_args();
  argv.insert(argv.end(), train.begin(), train.end());
  Subprocess job(argv, env);
  ProcessResult r = status_until({"--json"}, env, "\"collectives_done\":");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("\"run_id\":\"obs-local\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"world_size\":2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"libddp\":true"), std::string::npos) << r.out;
  // The trainer's steps (GradSync finish calls), timed by libddp.
  std::smatch m;
  ASSERT_TRUE(wait_until(
      [&] {
        r = run_process({kDdprun, "status", "--json"}, env, 10s);
        return std::regex_search(r.out, m,
                                 std::regex("\"steps\":([1-9][0-9]*),\"step_median_s\":([0-9.]+),"
                                            "\"step_p99_s\":([0-9.]+)")) &&
               std::stod(m[2]) > 0;
      },
      30s))
      << r.out;
  EXPECT_GE(std::stod(m[3]), std::stod(m[2])) << r.out;
  EXPECT_LT(std::stod(m[2]), 5.0) << "a step of the reference trainer takes milliseconds\n"
                                  << r.out;
  ProcessResult table = run_process({kDdprun, "status"}, env, 10s);
  EXPECT_EQ(table.code, 0) << table.err;
  EXPECT_NE(table.out.find("RANK"), std::string::npos) << table.out;
  EXPECT_TRUE(std::regex_search(table.out, std::regex("  0 .* [0-9]+ \\([0-9.]+ (us|ms), p99 ")))
      << table.out;
  kill(job.pid(), SIGTERM);
  job.wait(30s);
  // The entry is gone with the job.
  ProcessResult none = run_process({kDdprun, "status"}, env, 10s);
  EXPECT_EQ(none.code, 1);
  EXPECT_NE(none.err.find("no ddprun job"), std::string::npos) << none.err;
  std::filesystem::remove_all(runtime);
}

TEST(Status, TwoNodesAreSeenFromTheRendezvousAndBadTokensAreNamed) {
  const std::string ep = "127.0.0.1:" + std::to_string(free_port());
  const std::map<std::string, std::string> token = {{"DDP_RDZV_TOKEN", "obs-secret"}};
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::string> argv = {kDdprun,
                                     "--nnodes=2",
                                     "--nproc_per_node=2",
                                     "--node_rank=" + std::to_string(rank),
                                     "--rdzv_backend=c10d",
                                     "--rdzv_endpoint=" + ep,
                                     "--run_id=obs2",
                                     "--rdzv_conf=heartbeat_interval=0.2,heartbeat_timeout=5"};
    auto train = train_args();
    argv.insert(argv.end(), train.begin(), train.end());
    nodes.push_back(std::make_unique<Subprocess>(argv, token));
  }
  // Each node's first report rides on its next heartbeat: both are in within a second.
  ProcessResult r = status_until({ep, "--json"}, token, "\"world_size\":4");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("\"node_rank\":1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"rank\":3"), std::string::npos) << r.out;
  // Steps travel with the rest of each node's report.
  EXPECT_TRUE(wait_until(
      [&] {
        r = run_process({kDdprun, "status", ep, "--json"}, token, 10s);
        return std::regex_search(r.out, std::regex("\"rank\":3,[^}]*\"steps\":[1-9]"));
      },
      30s))
      << r.out;

  ProcessResult wrong = run_process({kDdprun, "status", ep}, {{"DDP_RDZV_TOKEN", "nope"}}, 10s);
  EXPECT_EQ(wrong.code, 1);
  EXPECT_NE(wrong.err.find("refused the token"), std::string::npos) << wrong.err;
  EXPECT_NE(wrong.err.find(ep), std::string::npos) << wrong.err;

  const std::string nobody = "127.0.0.1:" + std::to_string(free_port());
  ProcessResult gone = run_process({kDdprun, "status", nobody, "--timeout=1"}, token, 10s);
  EXPECT_EQ(gone.code, 1);
  EXPECT_NE(gone.err.find("no ddprun rendezvous answered at " + nobody), std::string::npos)
      << gone.err;
  for (auto& n : nodes) kill(n->pid(), SIGTERM);
  for (auto& n : nodes) n->wait(30s);
}

// Two local jobs, one in a network namespace (as in a container): ddprun
// status without an endpoint shows the one it can ask and names the other,
// with its pid, run id, endpoint and why, and exits 0.
class StatusNetns : public NetnsTest {};

TEST_F(StatusNetns, AJobThatCannotBeAskedIsNamedAndTheOthersAreShown) {
  if (IsSkipped()) return;
  const std::string runtime = make_temp_dir();
  const std::map<std::string, std::string> env = {{"XDG_RUNTIME_DIR", runtime}};
  NetnsHosts hosts(1);
  auto job_argv = [](const std::string& run_id) {
    std::vector<std::string> argv = {kDdprun, "--nproc_per_node=1", "--run_id=" + run_id};
    auto train = train_args();
    argv.insert(argv.end(), train.begin(), train.end());
    return argv;
  };
  Subprocess here(job_argv("st-here"), env);
  Subprocess there(hosts.on(0, job_argv("st-there")), env);
  // Both registered: the one in the namespace too (`ip netns exec` runs it in this pid's place).
  ASSERT_TRUE(wait_until(
      [&] {
        return std::filesystem::exists(runtime + "/ddprun/" + std::to_string(here.pid()) +
                                       ".job") &&
               std::filesystem::exists(runtime + "/ddprun/" + std::to_string(there.pid()) + ".job");
      },
      30s));
  ProcessResult r = status_until({"--json", "--timeout=1"}, env, "\"collectives_done\":");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("\"run_id\":\"st-here\",\"endpoint\""), std::string::npos) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      r.out, m,
      std::regex("\\{\"pid\":" + std::to_string(there.pid()) +
                 ",\"run_id\":\"st-there\",\"endpoint\":\"127\\.0\\.0\\.1:[0-9]+\","
                 "\"answered\":false,\"error\":\"([^\"]*)\"\\}")))
      << r.out;
  EXPECT_NE(m[1].str().find("runs in another network namespace"), std::string::npos) << m[1];
  EXPECT_EQ(m[1].str().find("older ddprun"), std::string::npos) << m[1];

  ProcessResult table = run_process({kDdprun, "status", "--timeout=1"}, env, 20s);
  EXPECT_EQ(table.code, 0) << table.out << table.err;
  EXPECT_NE(table.out.find("RANK"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("ddprun pid " + std::to_string(there.pid()) +
                           ", run 'st-there', rendezvous 127.0.0.1:"),
            std::string::npos)
      << table.out;

  kill(here.pid(), SIGTERM);
  kill(there.pid(), SIGTERM);
  here.wait(30s);
  there.wait(30s);
  std::filesystem::remove_all(runtime);
}

TEST(Status, AForeignServerGetsAClearMessage) {
  // An HTTP server (ddprun's own metrics port) is not a rendezvous.
  if (find_tool("python3").empty()) GTEST_SKIP() << "python3 is not installed";
  const int port = free_port();
  Subprocess http(
      {find_tool("python3"), "-m", "http.server", std::to_string(port), "--bind", "127.0.0.1"});
  ASSERT_TRUE(wait_until([&] { return connect_loopback(port) >= 0; }, 20s));
  ProcessResult r =
      run_process({kDdprun, "status", "127.0.0.1:" + std::to_string(port), "--timeout=2"}, {}, 20s);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
}

TEST(Metrics, APortInUseIsAnErrorBeforeAnyWorkerStarts) {
  BusyPort busy;
  const int port = busy.port();
  ASSERT_GT(port, 0);
  const std::string dir = make_temp_dir();
  ProcessResult r = run_process(
      {kDdprun, "--metrics_port=" + std::to_string(port), "/usr/bin/touch", dir + "/ran"}, {}, 30s);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--metrics_port=" + std::to_string(port)), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir + "/ran"));
  std::filesystem::remove_all(dir);
}

TEST(Metrics, PromtoolAcceptsTheOutputAndPrometheusScrapesIt) {
  const int port = free_port();
  std::vector<std::string> argv = {kDdprun, "--nproc_per_node=2",
                                   "--metrics_port=" + std::to_string(port), "--run_id=obs-prom"};
  auto train = train_args();
  argv.insert(argv.end(), train.begin(), train.end());
  Subprocess job(argv);
  std::string body;
  ASSERT_TRUE(wait_until(
      [&] {
        body = http_get(port, "/metrics");
        return body.find("ddprun_rank_collectives_total") != std::string::npos;
      },
      30s))
      << body;
  EXPECT_NE(body.find("ddprun_world_size{host="), std::string::npos) << body;
  const std::string dir = make_temp_dir();
  write_file(dir + "/metrics.txt", body);
  const std::string promtool = find_tool("promtool");
  if (promtool.empty()) {
    std::printf("promtool is not installed (Debian's prometheus): not checked\n");
  } else {
    ProcessResult check =
        run_process({"/bin/sh", "-c", promtool + " check metrics < " + dir + "/metrics.txt"});
    EXPECT_EQ(check.code, 0) << check.out << check.err;
  }
  const std::string prometheus = find_tool("prometheus");
  if (prometheus.empty()) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "prometheus is not installed (Debian's prometheus): no scrape test";
  }
  write_file(dir + "/prometheus.yml",
             "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: ddprun\n"
             "    static_configs:\n      - targets: ['127.0.0.1:" +
                 std::to_string(port) + "']\n");
  const int web = free_port();
  {
    // Killed (its process group) when this scope ends, whether the test passed or not.
    Subprocess server({prometheus, "--config.file=" + dir + "/prometheus.yml",
                       "--storage.tsdb.path=" + dir + "/data",
                       "--web.listen-address=127.0.0.1:" + std::to_string(web)});
    std::string answer;
    const bool answered = wait_until(
        [&] {
          answer =
              http_get(web, "/api/v1/query?query=ddprun_world_size%7Brun_id%3D%22obs-prom%22%7D");
          return answer.find("\"2\"]") != std::string::npos;
        },
        60s);
    EXPECT_TRUE(answered) << answer << "\n" << server.read_err().substr(0, 4000);
  }
  kill(job.pid(), SIGTERM);
  job.wait(30s);
  std::filesystem::remove_all(dir);
}

TEST(Events, ARestartIsRecordedWithTorchelasticFields) {
  const std::string dir = make_temp_dir();
  const std::string events = dir + "/events.jsonl";
  ProcessResult r =
      run_process({kDdprun, "--nproc_per_node=2", "--max_restarts=1", "--events_file=" + events,
                   "--run_id=obs-ev", "/bin/sh", "-c", "exit 3"},
                  {}, 60s);
  EXPECT_EQ(r.code, 3) << r.err;
  const std::string log = read_file(events);
  for (const std::string name :
       {"round_start", "worker_start", "worker_exit", "failure", "restart", "round_end"}) {
    EXPECT_NE(log.find("\"name\":\"" + name + "\""), std::string::npos) << name << "\n" << log;
  }
  EXPECT_NE(log.find("\"exit_code\":3"), std::string::npos) << log;
  EXPECT_NE(log.find("\"run_id\":\"obs-ev\""), std::string::npos) << log;
  EXPECT_NE(log.find("\"round\":2"), std::string::npos) << log;
  std::filesystem::remove_all(dir);
}

TEST(Events, AFullDiskIsReportedOnceAndTheJobGoesOn) {
  ProcessResult r = run_process({kDdprun, "--nproc_per_node=3", "--max_restarts=2",
                                 "--events_file=/dev/full", "/bin/sh", "-c", "exit 0"},
                                {}, 60s);
  EXPECT_EQ(r.code, 0) << r.err;
  size_t count = 0;
  for (size_t at = 0; (at = r.err.find("writing the event log", at)) != std::string::npos; ++at) {
    ++count;
  }
  EXPECT_EQ(count, 1u) << r.err;
}

}  // namespace
}  // namespace ddp::testing
