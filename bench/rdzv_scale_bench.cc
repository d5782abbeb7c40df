// rdzv_scale_bench: COUNT simulated node agents of one job, against a real
// rendezvous server (`ddprun rendezvous`), each with a connection of its own,
// speaking the agents' gRPC protocol (proto/ddp/v1/rendezvous.proto) through
// gRPC's asynchronous API on one thread: a real agent is a process of its
// own on a machine of its own, so a thread and a blocking call per agent
// here would make the clients, not the server, what is measured.
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
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "ddp/v1/rendezvous.grpc.pb.h"

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

// One simulated agent: its connection and the call in flight.
struct Agent {
  enum class Phase { kWarm, kJoin, kBarrier, kDone } phase = Phase::kWarm;
  int id = 0;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<ddp::v1::Rendezvous::Stub> stub;
  std::unique_ptr<grpc::ClientContext> ctx;
  grpc::Status status;
  ddp::v1::NumKeysResponse num_keys;
  ddp::v1::JoinResponse joined;
  ddp::v1::BarrierResponse passed;
};

class Agents {
 public:
  explicit Agents(const Options& o) : o_(o), agents_(static_cast<std::size_t>(o.count)) {
    auth_.set_run_id(o.run_id);
    auth_.set_token(o.token);
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection per agent, as agents have
    for (int i = 0; i < o.count; ++i) {
      Agent& a = agents_[static_cast<std::size_t>(i)];
      a.id = o.first + i;
      a.channel = grpc::CreateCustomChannel(o.endpoint, grpc::InsecureChannelCredentials(), args);
      a.stub = ddp::v1::Rendezvous::NewStub(a.channel);
    }
  }

  // Every connection made and warm (one NumKeys each).
  void warm() {
    for (Agent& a : agents_) {
      ddp::v1::NumKeysRequest req;
      *req.mutable_auth() = auth_;
      a.stub->AsyncNumKeys(context(a, 60s), req, &cq_)->Finish(&a.num_keys, &a.status, &a);
    }
    drain(Agent::Phase::kWarm);
  }

  void join_and_pass_barrier() {
    for (Agent& a : agents_) {
      a.phase = Agent::Phase::kJoin;
      ddp::v1::JoinRequest req;
      *req.mutable_auth() = auth_;
      req.set_node_rank(-1);
      req.set_local_world_size(o_.workers);
      req.set_hostname("agent-" + std::to_string(a.id));
      req.set_address("10." + std::to_string(a.id / 65536) + "." +
                      std::to_string(a.id / 256 % 256) + "." + std::to_string(a.id % 256));
      req.set_master_port(29500);
      last_sent_ = now_ns();
      a.stub->AsyncJoin(context(a, 300s), req, &cq_)->Finish(&a.joined, &a.status, &a);
    }
    drain(Agent::Phase::kJoin);
  }

  std::int64_t last_sent_ = 0, last_joined_ = 0, last_barrier_ = 0;

 private:
  grpc::ClientContext* context(Agent& a, std::chrono::seconds timeout) {
    a.ctx = std::make_unique<grpc::ClientContext>();
    a.ctx->set_deadline(std::chrono::system_clock::now() + timeout);
    a.ctx->set_wait_for_ready(true);
    return a.ctx.get();
  }

  // Until no agent is in `phase` or a later one before kDone (joins go on to
  // their barrier). Exits 1 naming the first agent whose call failed.
  void drain(Agent::Phase phase) {
    std::size_t left = agents_.size();
    void* tag = nullptr;
    bool ok = false;
    while (left > 0 && cq_.Next(&tag, &ok)) {
      Agent& a = *static_cast<Agent*>(tag);
      if (!ok || !a.status.ok()) {
        std::fprintf(stderr, "rdzv_scale_bench: agent %d: %s: %s\n", a.id, phase_name(a.phase),
                     a.status.error_message().c_str());
        std::exit(1);
      }
      if (a.phase == Agent::Phase::kJoin) {
        last_joined_ = std::max(last_joined_, now_ns());
        check(a);
        a.phase = Agent::Phase::kBarrier;
        ddp::v1::BarrierRequest req;
        *req.mutable_auth() = auth_;
        req.set_name("scale");
        req.set_rank(a.joined.group_rank());
        req.set_world_size(a.joined.group_world_size());
        req.set_timeout_ms(300000);
        a.stub->AsyncBarrier(context(a, 300s), req, &cq_)->Finish(&a.passed, &a.status, &a);
        continue;
      }
      if (a.phase == Agent::Phase::kBarrier) last_barrier_ = std::max(last_barrier_, now_ns());
      if (phase != Agent::Phase::kWarm) a.phase = Agent::Phase::kDone;
      --left;
    }
  }

  void check(const Agent& a) const {
    if (a.joined.group_world_size() != o_.nnodes ||
        a.joined.world_size() != o_.nnodes * o_.workers) {
      std::fprintf(stderr, "rdzv_scale_bench: agent %d: assigned %d nodes, %d ranks\n", a.id,
                   a.joined.group_world_size(), a.joined.world_size());
      std::exit(1);
    }
  }

  static const char* phase_name(Agent::Phase p) {
    return p == Agent::Phase::kWarm ? "NumKeys" : p == Agent::Phase::kJoin ? "Join" : "Barrier";
  }

  const Options& o_;
  ddp::v1::Auth auth_;
  std::vector<Agent> agents_;
  grpc::CompletionQueue cq_;
};

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  Agents agents(o);
  agents.warm();
  std::printf("ready\n");
  std::fflush(stdout);
  char line[16];
  if (std::fgets(line, sizeof line, stdin) == nullptr) return 1;  // the driver is gone
  agents.join_and_pass_barrier();
  std::printf(
      "{\"agents\": %d, \"last_join_sent_ns\": %lld, \"last_joined_ns\": %lld, "
      "\"last_barrier_ns\": %lld}\n",
      o.count, static_cast<long long>(agents.last_sent_),
      static_cast<long long>(agents.last_joined_), static_cast<long long>(agents.last_barrier_));
  // Stays until stdin closes, so that the driver can read this process's CPU time.
  std::fflush(stdout);
  while (std::fgets(line, sizeof line, stdin) != nullptr) {
  }
  return 0;
}
