// rdzv_scale_bench: COUNT simulated node agents of one job, against a real
// rendezvous server (`ddprun rendezvous`), each with a connection of its own
// and speaking the agents' gRPC protocol (ddp/common/rendezvous_client.h).
// Several of these processes make one job (bench/rdzv_scale.py starts them):
//
//   rdzv_scale_bench --endpoint HOST:PORT --run_id ID --nnodes N --first F --count C
//                    [--workers 8] [--token T]
//
// Each agent connects and warms its connection; once all have, the process
// prints "ready" and waits for a line on stdin (the driver's go, given to
// every process once all are ready). Then each agent calls Join with `workers`
// workers, checks its assignment (N nodes, N x workers ranks) and passes one
// barrier of the N nodes. Prints one JSON line of CLOCK_MONOTONIC
// nanoseconds (the same clock in every process of the machine): the
// last Join sent, the last assignment received, the last barrier passed;
// exits 1 naming the agent when one fails, 2 on a bad flag.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ddp/common/rendezvous_client.h"

namespace {

using namespace std::chrono_literals;

struct Options {
  std::string endpoint, run_id, token;
  int nnodes = 0, first = 0, count = 0, workers = 8;
};

std::int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void keep_max(std::atomic<std::int64_t>& to, std::int64_t value) {
  for (std::int64_t seen = to.load(); seen < value && !to.compare_exchange_weak(seen, value);) {
  }
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "rdzv_scale_bench: %s\nusage: rdzv_scale_bench --endpoint HOST:PORT --run_id ID "
               "--nnodes N --first F --count C [--workers W] [--token T]\n",
               why.c_str());
  std::exit(2);
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(flag + " needs a value");
    const std::string value = argv[++i];
    try {
      if (flag == "--endpoint")
        o.endpoint = value;
      else if (flag == "--run_id")
        o.run_id = value;
      else if (flag == "--token")
        o.token = value;
      else if (flag == "--nnodes")
        o.nnodes = std::stoi(value);
      else if (flag == "--first")
        o.first = std::stoi(value);
      else if (flag == "--count")
        o.count = std::stoi(value);
      else if (flag == "--workers")
        o.workers = std::stoi(value);
      else
        usage("unknown flag " + flag);
    } catch (const std::logic_error&) {
      usage(flag + " " + value + " is not a number");
    }
  }
  if (o.endpoint.empty() || o.run_id.empty()) usage("--endpoint and --run_id are required");
  if (o.nnodes < 1 || o.count < 1 || o.first < 0 || o.first + o.count > o.nnodes)
    usage("--first and --count must name agents within --nnodes");
  if (o.workers < 1) usage("--workers must be at least 1");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  std::vector<std::unique_ptr<ddp::RendezvousClient>> clients;
  for (int i = 0; i < o.count; ++i)
    clients.push_back(std::make_unique<ddp::RendezvousClient>(o.endpoint, o.run_id, o.token));
  std::atomic<std::int64_t> last_sent{0}, last_joined{0}, last_barrier{0};
  std::atomic<int> failed{-1}, warm{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> agents;
  for (int i = 0; i < o.count; ++i) {
    agents.emplace_back([&, i] {
      const int id = o.first + i;
      ddp::RendezvousClient& c = *clients[i];
      try {
        try {
          c.num_keys();  // connected before the clock starts
        } catch (...) {
          warm.fetch_add(1);
          throw;
        }
        warm.fetch_add(1);
        while (!go.load()) std::this_thread::sleep_for(1ms);
        ddp::NodeInfo node;
        node.local_world_size = o.workers;
        node.hostname = "agent-" + std::to_string(id);
        node.address = "10." + std::to_string(id / 65536) + "." + std::to_string(id / 256 % 256) +
                       "." + std::to_string(id % 256);
        node.master_port = 29500;
        keep_max(last_sent, now_ns());
        const ddp::RoundAssignment a = c.join(node, 120s);
        keep_max(last_joined, now_ns());
        if (a.group_world_size != o.nnodes || a.world_size != o.nnodes * o.workers)
          throw std::runtime_error("assigned " + std::to_string(a.group_world_size) + " nodes, " +
                                   std::to_string(a.world_size) + " ranks");
        c.barrier("scale", a.group_rank, a.group_world_size, 120s);
        keep_max(last_barrier, now_ns());
      } catch (const std::exception& e) {
        int none = -1;
        if (failed.compare_exchange_strong(none, id))
          std::fprintf(stderr, "rdzv_scale_bench: agent %d: %s\n", id, e.what());
      }
    });
  }
  while (warm.load() < o.count) std::this_thread::sleep_for(10ms);
  std::printf("ready\n");
  std::fflush(stdout);
  char line[16];
  if (std::fgets(line, sizeof line, stdin) == nullptr) failed.store(-2);  // the driver is gone
  go.store(true);
  for (auto& t : agents) t.join();
  if (failed.load() != -1) return 1;
  std::printf(
      "{\"agents\": %d, \"last_join_sent_ns\": %lld, \"last_joined_ns\": %lld, "
      "\"last_barrier_ns\": %lld}\n",
      o.count, static_cast<long long>(last_sent.load()), static_cast<long long>(last_joined.load()),
      static_cast<long long>(last_barrier.load()));
  return 0;
}
