// rdzv_bench: how fast the rendezvous control plane answers, over real gRPC on
// loopback, with the server in this process (127.0.0.1, ephemeral port).
//
//   store round trip    one client: Set then Get of the same key, per pair
//   barrier N           N threads, each with its own RendezvousClient
//                       (connection), passing barriers back to back
//   1024 ranks          each rank Sets its key, Gets its neighbour's (waiting
//                       for it), then passes one barrier of 1024
//   1024 nodes join     1024 agents Join one round (--nnodes=1024, one worker
//                       each), then pass one barrier of 1024
//
// Prints `metric  value  unit`. Connections are made and warmed up before a
// timed section starts; the large cases start all threads at one gate and stop
// when the last one is done.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/common/rendezvous_client.h"
#include "rpc/rendezvous_service.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using ddp::RendezvousClient;
using ddp::launcher::RendezvousConfig;
using ddp::launcher::RendezvousServer;
using ddp::launcher::ServerOptions;

constexpr char kRunId[] = "bench";
constexpr char kToken[] = "bench-token";

double us_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

void row(const std::string& metric, double value, const char* unit) {
  std::printf("%-44s %12.1f  %s\n", metric.c_str(), value, unit);
  std::fflush(stdout);
}

RendezvousConfig config(int nodes) {
  RendezvousConfig c;
  c.run_id = kRunId;
  c.token = kToken;
  c.min_nodes = c.max_nodes = nodes;
  c.join_timeout = 120s;
  c.last_call_timeout = 0ms;
  c.heartbeat_timeout = 600s;  // the bench sends no heartbeats
  return c;
}

struct Server {
  explicit Server(int nodes = 1) : server(config(nodes), ServerOptions{}) {}
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(server.port()); }
  std::unique_ptr<RendezvousClient> client() const {
    return std::make_unique<RendezvousClient>(endpoint(), kRunId, kToken);
  }
  RendezvousServer server;
};

// Runs fn(i) on `threads` threads released together; returns ms from the
// release to the last thread's return.
double run_together(int threads, const std::function<void(int)>& fn,
                    Clock::time_point* started = nullptr) {
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  int ready = 0;
  std::vector<std::thread> pool;
  pool.reserve(threads);
  std::atomic<int> failures{0};
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      {
        std::unique_lock<std::mutex> lock(mu);
        ++ready;
        cv.notify_all();
        cv.wait(lock, [&] { return go; });
      }
      try {
        fn(i);
      } catch (const std::exception& e) {
        if (failures.fetch_add(1) == 0)
          std::fprintf(stderr, "rdzv_bench: thread %d: %s\n", i, e.what());
      }
    });
  }
  Clock::time_point start;
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return ready == threads; });
    go = true;
    start = Clock::now();
    if (started) *started = start;
  }
  cv.notify_all();
  for (auto& t : pool) t.join();
  const double ms = us_between(start, Clock::now()) / 1000.0;
  if (failures.load() > 0) {
    std::fprintf(stderr, "rdzv_bench: %d of %d threads failed\n", failures.load(), threads);
    std::exit(1);
  }
  return ms;
}

void bench_store() {
  Server s;
  auto c = s.client();
  const std::string value(64, 'v');
  for (int i = 0; i < 200; ++i) {  // warm up: connect, allocate
    c->set("warm/" + std::to_string(i % 8), value);
    c->try_get("warm/" + std::to_string(i % 8));
  }
  constexpr int kPairs = 2000;
  std::vector<double> pair_us, set_us, get_us;
  for (int i = 0; i < kPairs; ++i) {
    const std::string key = "store/" + std::to_string(i % 64);
    const auto t0 = Clock::now();
    c->set(key, value);
    const auto t1 = Clock::now();
    c->try_get(key);
    const auto t2 = Clock::now();
    set_us.push_back(us_between(t0, t1));
    get_us.push_back(us_between(t1, t2));
    pair_us.push_back(us_between(t0, t2));
  }
  row("store Set+Get pair, median (2000 pairs)", percentile(pair_us, 0.5), "us");
  row("store Set+Get pair, p99", percentile(pair_us, 0.99), "us");
  row("store Set alone, median", percentile(set_us, 0.5), "us");
  row("store Get alone, median", percentile(get_us, 0.5), "us");
}

void bench_barrier(int world) {
  Server s;
  std::vector<std::unique_ptr<RendezvousClient>> clients;
  for (int r = 0; r < world; ++r) clients.push_back(s.client());
  constexpr int kWarmup = 20, kIters = 200;
  std::vector<double> rank0_us;
  rank0_us.reserve(kIters);
  run_together(world, [&](int r) {
    for (int i = 0; i < kWarmup + kIters; ++i) {
      const auto t0 = Clock::now();
      clients[r]->barrier("bench", r, world, 30s);
      if (r == 0 && i >= kWarmup) rank0_us.push_back(us_between(t0, Clock::now()));
    }
  });
  row("barrier " + std::to_string(world) + " ranks, median (200 barriers)",
      percentile(rank0_us, 0.5), "us");
  row("barrier " + std::to_string(world) + " ranks, p99", percentile(rank0_us, 0.99), "us");
}

// `ranks` simulated ranks on `channels` clients (one connection each), ranks
// spread round-robin over them.
void bench_many_ranks(int ranks, int channels) {
  Server s;
  std::vector<std::unique_ptr<RendezvousClient>> clients;
  for (int i = 0; i < channels; ++i) clients.push_back(s.client());
  run_together(channels, [&](int i) { clients[i]->num_keys(); });  // connect every channel
  const double ms = run_together(ranks, [&](int r) {
    RendezvousClient& c = *clients[r % channels];
    c.set("addr/" + std::to_string(r), "10.0.0." + std::to_string(r % 250) + ":29500");
    c.get("addr/" + std::to_string((r + 1) % ranks), 60s);
    c.barrier("init", r, ranks, 60s);
  });
  row(std::to_string(ranks) + " ranks: Set + Get neighbour + barrier", ms, "ms");
}

void bench_join(int nodes, int channels) {
  Server s(nodes);
  std::vector<std::unique_ptr<RendezvousClient>> clients;
  for (int i = 0; i < channels; ++i) clients.push_back(s.client());
  run_together(channels, [&](int i) { clients[i]->num_keys(); });
  std::atomic<int> bad{0};
  std::atomic<std::int64_t> last_joined_ns{0};
  Clock::time_point start;
  const double ms = run_together(
      nodes,
      [&](int n) {
        RendezvousClient& c = *clients[n % channels];
        ddp::NodeInfo node;
        node.local_world_size = 1;
        node.hostname = "node-" + std::to_string(n);
        node.address = "10.1." + std::to_string(n / 250) + "." + std::to_string(n % 250);
        node.master_port = 29500;
        auto a = c.join(node, 60s);
        if (a.world_size != nodes || a.group_world_size != nodes) bad.fetch_add(1);
        const std::int64_t joined =
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
        for (std::int64_t seen = last_joined_ns.load();
             seen < joined && !last_joined_ns.compare_exchange_weak(seen, joined);) {
        }
        c.barrier("joined", a.group_rank, a.world_size, 60s);
      },
      &start);
  if (bad.load() > 0) {
    std::fprintf(stderr, "rdzv_bench: %d nodes got a wrong world size\n", bad.load());
    std::exit(1);
  }
  row(std::to_string(nodes) + " nodes: Join one round",
      static_cast<double>(last_joined_ns.load()) / 1e6, "ms");
  row(std::to_string(nodes) + " nodes: Join one round + barrier", ms, "ms");
}

}  // namespace

int main(int argc, char** argv) {
  // rdzv_bench [CHANNELS]: connections shared by the 1024 simulated ranks or
  // nodes (default 1024: one each, as real workers and agents have).
  const int channels = argc > 1 ? std::atoi(argv[1]) : 1024;
  if (channels < 1 || channels > 1024) {
    std::fprintf(stderr, "usage: rdzv_bench [CHANNELS in 1..1024]\n");
    return 2;
  }
  std::printf("rendezvous over gRPC on 127.0.0.1, server in-process, %u hardware threads\n",
              std::thread::hardware_concurrency());
  std::printf("%-44s %12s  %s\n", "metric", "value", "unit");
  bench_store();
  for (int world : {2, 4, 8}) bench_barrier(world);
  if (channels == 1024) {
    std::printf("# 1024 ranks/nodes below: 1024 threads, each with its own client (connection)\n");
  } else {
    std::printf(
        "# 1024 ranks/nodes below: 1024 threads sharing %d clients (connections), %d threads "
        "each\n",
        channels, 1024 / channels);
  }
  bench_many_ranks(1024, channels);
  bench_join(1024, channels);
  std::printf(
      "# targets: barrier at 4 ranks < 500 us; 1024 nodes through join + barrier < 1000 ms\n"
      "# peer, measured on the same machine: /usr/bin/python3 bench/peers/barrier.py 5 "
      "(torch's Gloo barrier)\n");
  return 0;
}
