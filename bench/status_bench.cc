// status_bench: how fast `ddprun status` answers for a large job, against a
// rendezvous in this process (127.0.0.1, ephemeral port) holding what
// simulated agents reported: NODES agents x RANKS_PER_NODE workers each
// (default 128 x 8 = 1,024 ranks), every agent joined to one round and sent
// one heartbeat carrying its node's state (every rank running, in a
// collective, with pid, CPU, RSS, collective counts).
//
//   status_bench DDPRUN [NODES [RANKS_PER_NODE [RUNS]]]
//
// Times RUNS invocations of the real command, `DDPRUN status 127.0.0.1:PORT`
// (the table) and `... --json`, each a fresh process as a user runs it, from
// spawn to exit; prints the median and the slowest. Target: 100 ms for 1,024
// ranks.

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ddp/common/rendezvous_client.h"
#include "ddp/v1/rendezvous.pb.h"
#include "rpc/rendezvous_service.h"

extern char** environ;

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr char kRunId[] = "status-bench";
constexpr char kToken[] = "status-bench-token";

// One node's report, as an agent sends it with its heartbeats.
std::string node_state(int node, int ranks_per_node, int world) {
  ddp::v1::NodeState s;
  s.set_node_rank(node);
  s.set_host("node-" + std::to_string(node));
  s.set_round(1);
  s.set_age_s(120.0);
  s.set_run_id(kRunId);
  s.set_world_size(world);
  for (int l = 0; l < ranks_per_node; ++l) {
    ddp::v1::RankState* r = s.add_ranks();
    r->set_rank(node * ranks_per_node + l);
    r->set_local_rank(l);
    r->set_pid(100000 + node * ranks_per_node + l);
    r->set_state("in_collective");
    r->set_collective_op("all_reduce");
    r->set_collective_seq(4242);
    r->set_in_collective_s(0.004);
    r->set_last_output_age_s(1.5);
    r->set_cpu_percent(97.0);
    r->set_rss_bytes(std::uint64_t{3} << 30);
    r->set_collectives_done(4241);
    r->set_collective_wait_s(12.5);
    r->set_libddp(true);
  }
  return s.SerializeAsString();
}

// Every simulated agent joins the round, then reports its node once.
void simulate_agents(const std::string& endpoint, int nodes, int ranks_per_node) {
  std::atomic<int> failures{0};
  std::vector<std::thread> agents;
  for (int n = 0; n < nodes; ++n) {
    agents.emplace_back([&, n] {
      try {
        ddp::RendezvousClient client(endpoint, kRunId, kToken);
        ddp::NodeInfo info;
        info.node_rank = n;
        info.local_world_size = ranks_per_node;
        info.hostname = "node-" + std::to_string(n);
        info.address = "10.1." + std::to_string(n / 250) + "." + std::to_string(n % 250);
        info.master_port = 29500;
        const auto round = client.join(info, 120s);
        client.heartbeat(round.round, round.group_rank, 30s, {}, nullptr,
                         node_state(n, ranks_per_node, nodes * ranks_per_node));
      } catch (const std::exception& e) {
        if (failures.fetch_add(1) == 0)
          std::fprintf(stderr, "status_bench: agent %d: %s\n", n, e.what());
      }
    });
  }
  for (auto& t : agents) t.join();
  if (failures.load() > 0) std::exit(1);
}

// Milliseconds from spawning `argv` (stdout to `out`) to its exit 0.
double time_command(const std::vector<std::string>& argv, const char* out = "/dev/null") {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  const auto start = Clock::now();
  pid_t pid = -1;
  if (posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ) != 0) {
    std::fprintf(stderr, "status_bench: cannot start %s\n", args[0]);
    std::exit(1);
  }
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  waitpid(pid, &status, 0);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "status_bench: %s status failed (status %d)\n", args[0], status);
    std::exit(1);
  }
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: status_bench DDPRUN [NODES [RANKS_PER_NODE [RUNS]]]\n");
    return 2;
  }
  const std::string ddprun = argv[1];
  const int nodes = argc > 2 ? std::atoi(argv[2]) : 128;
  const int per_node = argc > 3 ? std::atoi(argv[3]) : 8;
  const int runs = argc > 4 ? std::atoi(argv[4]) : 15;
  if (nodes < 1 || nodes > 1024 || per_node < 1 || per_node > 64 || runs < 1) {
    std::fprintf(stderr, "status_bench: NODES in 1..1024, RANKS_PER_NODE in 1..64, RUNS >= 1\n");
    return 2;
  }
  ddp::launcher::RendezvousConfig config;
  config.run_id = kRunId;
  config.token = kToken;
  config.min_nodes = config.max_nodes = nodes;
  config.join_timeout = 120s;
  config.last_call_timeout = 0ms;
  config.heartbeat_timeout = 600s;
  ddp::launcher::RendezvousServer server(config, ddp::launcher::ServerOptions{});
  const std::string endpoint = "127.0.0.1:" + std::to_string(server.port());
  simulate_agents(endpoint, nodes, per_node);

  setenv("DDP_RDZV_TOKEN", kToken, 1);
  std::printf(
      "ddprun status against %d simulated agents x %d ranks (%d ranks), %d runs each, "
      "%u hardware threads\n",
      nodes, per_node, nodes * per_node, runs, std::thread::hardware_concurrency());
  for (const bool json : {false, true}) {
    std::vector<std::string> cmd = {ddprun, "status", endpoint};
    if (json) cmd.push_back("--json");
    time_command(cmd);  // warm: the binary and its libraries in the page cache
    std::vector<double> ms;
    for (int i = 0; i < runs; ++i) ms.push_back(time_command(cmd));
    std::sort(ms.begin(), ms.end());
    std::printf("%-28s median %7.1f ms   slowest %7.1f ms\n",
                json ? "ddprun status --json" : "ddprun status (table)", ms[ms.size() / 2],
                ms.back());
  }
  // What was timed is the whole job: one JSON rank entry per rank.
  char path[] = "/tmp/status_bench_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return 1;
  close(fd);
  time_command({ddprun, "status", endpoint, "--json"}, path);
  std::FILE* f = std::fopen(path, "r");
  std::string text;
  for (int c; f != nullptr && (c = std::fgetc(f)) != EOF;) text.push_back(static_cast<char>(c));
  if (f != nullptr) std::fclose(f);
  std::remove(path);
  int shown = 0;
  for (auto at = text.find("\"local_rank\""); at != std::string::npos;
       at = text.find("\"local_rank\"", at + 1)) {
    ++shown;
  }
  std::printf("# the --json output lists %d of the %d ranks\n", shown, nodes * per_node);
  std::printf("# target: 100 ms for 1,024 ranks\n");
  if (shown != nodes * per_node) return 1;
  return 0;
}
