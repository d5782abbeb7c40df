// libFuzzer target: the rendezvous gRPC service (RendezvousService) fed
// requests as it receives them. One in-process gRPC server per input (a fresh
// RendezvousState, so no input depends on the ones before it) serves the
// service, with the standard health service, on an in-process channel. The
// input is a sequence of calls: a byte choosing the method (the twelve of
// ddp.v1.Rendezvous, grpc.health.v1.Health/Check, an unknown method), whether
// the request is raw bytes or built, whether the call is awaited at once or
// left in flight (up to 8 are, so joins, barriers and waits can meet), and its
// client deadline (1 to 50 ms). A raw request is a length and that many bytes
// sent as the serialized request (grpc::GenericStub), so the server decodes
// arbitrary bytes, invalid protobuf included; a built one is a valid message
// whose fields come from the input, with the right token and run id or a
// wrong, missing or foreign one, so the calls get past decoding into the
// handlers. The service's config has short timeouts (a few ms) and small
// limits, so that every refusal path is reached and no call blocks long.
// Checked: a built request with a wrong token or run id is never answered OK
// (a wrong token only with UNAUTHENTICATED, or the client's deadline); an OK
// answer to a built request decodes as its response type; after the input the
// server still answers the health check, a NumKeys and a Get with the right
// token. Built and run by scripts/fuzz.sh (clang, with AddressSanitizer and
// UndefinedBehaviorSanitizer).

#include <fuzzer/FuzzedDataProvider.h>
#include <google/protobuf/stubs/logging.h>
#include <grpc/support/log.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "ddp/v1/rendezvous.pb.h"
#include "rpc/rendezvous_service.h"
#include "small_limits.h"

namespace {

using namespace ddp::launcher;
using namespace std::chrono_literals;

constexpr char kRunId[] = "run";
constexpr char kToken[] = "secret";
constexpr int kMaxInFlight = 8;
constexpr int kMaxMessageBytes = 2048;

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "rendezvous_service_fuzz: %s\n", why.c_str());
  std::abort();
}

RendezvousConfig make_config() {
  RendezvousConfig c;
  c.run_id = kRunId;
  c.token = kToken;
  c.min_nodes = 1;
  c.max_nodes = 2;
  c.join_timeout = 20ms;
  c.last_call_timeout = 2ms;
  c.heartbeat_timeout = 20ms;
  c.max_restarts = 2;
  c.limits = small_fuzz_limits();
  return c;
}

// One server with a fresh service: what an input talks to.
struct Fixture {
  Fixture() : service(make_config()) {
    grpc::ServerBuilder builder;
    builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    if (!server) fail("cannot start the in-process server");
    stub = std::make_unique<grpc::GenericStub>(server->InProcessChannel(grpc::ChannelArguments{}));
  }
  ~Fixture() {
    service.stop();
    server->Shutdown(std::chrono::system_clock::now() + 1s);
    server->Wait();
  }
  RendezvousService service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<grpc::GenericStub> stub;
};

enum Method {
  kJoin,
  kHeartbeat,
  kReportFailure,
  kLeave,
  kSet,
  kGet,
  kAdd,
  kCompareSet,
  kWait,
  kDelete,
  kNumKeys,
  kBarrier,
  kHealthCheck,
  kUnknown,
  kMethods
};
const char* const kPaths[kMethods] = {
    "/ddp.v1.Rendezvous/Join",          "/ddp.v1.Rendezvous/Heartbeat",
    "/ddp.v1.Rendezvous/ReportFailure", "/ddp.v1.Rendezvous/Leave",
    "/ddp.v1.Rendezvous/Set",           "/ddp.v1.Rendezvous/Get",
    "/ddp.v1.Rendezvous/Add",           "/ddp.v1.Rendezvous/CompareSet",
    "/ddp.v1.Rendezvous/Wait",          "/ddp.v1.Rendezvous/Delete",
    "/ddp.v1.Rendezvous/NumKeys",       "/ddp.v1.Rendezvous/Barrier",
    "/grpc.health.v1.Health/Check",     "/ddp.v1.Rendezvous/NoSuchMethod"};

enum class Caller { kRight, kWrongToken, kWrongRun, kNoAuth };

struct Call {
  Method method = kUnknown;
  bool built = false;
  Caller caller = Caller::kRight;
  grpc::ClientContext ctx;
  grpc::ByteBuffer request, response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;

  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, 10s, [this] { return done; }))
      fail(std::string(kPaths[method]) + ": no answer within 10 s");
  }
};

grpc::ByteBuffer buffer_of(const std::string& bytes) {
  grpc::Slice slice(bytes.data(), bytes.size());
  return grpc::ByteBuffer(&slice, 1);
}

std::string bytes_of(const grpc::ByteBuffer& buffer) {
  grpc::Slice slice;
  if (!buffer.TrySingleSlice(&slice).ok() && !buffer.DumpToSingleSlice(&slice).ok()) return {};
  return std::string(reinterpret_cast<const char*>(slice.begin()), slice.size());
}

void start(Fixture& f, Call& call, std::chrono::milliseconds deadline) {
  call.ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  f.stub->UnaryCall(&call.ctx, kPaths[call.method], grpc::StubOptions(), &call.request,
                    &call.response, [&call](grpc::Status status) {
                      std::lock_guard<std::mutex> lock(call.mu);
                      call.status = std::move(status);
                      call.done = true;
                      call.cv.notify_all();
                    });
}

// The checks on an answered call.
void check(Call& call) {
  const std::string name = kPaths[call.method];
  const grpc::StatusCode code = call.status.error_code();
  if (!call.built) return;  // raw bytes: any answer will do, as long as one comes
  if (call.method == kUnknown) {
    if (code != grpc::StatusCode::UNIMPLEMENTED && code != grpc::StatusCode::DEADLINE_EXCEEDED) {
      fail(name + ": answered " + std::to_string(code) + " " + call.status.error_message());
    }
    return;
  }
  if (call.method != kHealthCheck && call.caller != Caller::kRight &&
      code == grpc::StatusCode::OK) {
    fail(name + ": a request with a wrong or missing token or run id was answered OK");
  }
  if (call.method != kHealthCheck &&
      (call.caller == Caller::kWrongToken || call.caller == Caller::kNoAuth) &&
      code != grpc::StatusCode::UNAUTHENTICATED && code != grpc::StatusCode::DEADLINE_EXCEEDED) {
    fail(name + ": a request with a wrong token was answered " + std::to_string(code) + " " +
         call.status.error_message());
  }
  if (code != grpc::StatusCode::OK) return;
  const std::string body = bytes_of(call.response);
  std::unique_ptr<google::protobuf::MessageLite> response;
  switch (call.method) {
    case kJoin:
      response = std::make_unique<ddp::v1::JoinResponse>();
      break;
    case kHeartbeat:
      response = std::make_unique<ddp::v1::HeartbeatResponse>();
      break;
    case kReportFailure:
      response = std::make_unique<ddp::v1::ReportFailureResponse>();
      break;
    case kLeave:
      response = std::make_unique<ddp::v1::LeaveResponse>();
      break;
    case kSet:
      response = std::make_unique<ddp::v1::SetResponse>();
      break;
    case kGet:
      response = std::make_unique<ddp::v1::GetResponse>();
      break;
    case kAdd:
      response = std::make_unique<ddp::v1::AddResponse>();
      break;
    case kCompareSet:
      response = std::make_unique<ddp::v1::CompareSetResponse>();
      break;
    case kWait:
      response = std::make_unique<ddp::v1::WaitResponse>();
      break;
    case kDelete:
      response = std::make_unique<ddp::v1::DeleteResponse>();
      break;
    case kNumKeys:
      response = std::make_unique<ddp::v1::NumKeysResponse>();
      break;
    case kBarrier:
      response = std::make_unique<ddp::v1::BarrierResponse>();
      break;
    default:
      return;
  }
  if (!response->ParseFromString(body))
    fail(name + ": the OK answer does not decode as its response type");
  if (call.method == kJoin) {
    const auto& j = static_cast<const ddp::v1::JoinResponse&>(*response);
    if (j.group_rank() < 0 || j.group_rank() >= j.group_world_size() ||
        j.global_rank_offset() < 0 || j.global_rank_offset() >= j.world_size()) {
      fail("Join: answered a place outside its round: " + j.ShortDebugString());
    }
  }
}

ddp::v1::Auth auth_for(Caller caller) {
  ddp::v1::Auth a;
  switch (caller) {
    case Caller::kRight:
      a.set_run_id(kRunId);
      a.set_token(kToken);
      break;
    case Caller::kWrongToken:
      a.set_run_id(kRunId);
      a.set_token("wrong");
      break;
    case Caller::kWrongRun:
      a.set_run_id("other");
      a.set_token(kToken);
      break;
    case Caller::kNoAuth:
      break;
  }
  return a;
}

// A valid request for `method` whose fields come from the input.
std::string build_request(Method method, Caller caller, FuzzedDataProvider& in) {
  static const char* const kKeys[] = {"a", "b", "pg/x", "", "a-key-longer-than-24-bytes"};
  static const char* const kHosts[] = {"h0", "h1", "h2"};
  auto key = [&] { return std::string(kKeys[in.ConsumeIntegralInRange(0, 4)]); };
  auto value = [&] {
    return in.ConsumeBool() ? std::to_string(in.ConsumeIntegral<std::int8_t>())
                            : in.ConsumeRandomLengthString(80);
  };
  auto round = [&] { return in.ConsumeIntegralInRange<std::int64_t>(-1, 4); };
  auto rank = [&] { return in.ConsumeIntegralInRange(-1, 3); };
  auto timeout = [&] { return in.ConsumeIntegralInRange<std::int64_t>(-1, 60); };
  const ddp::v1::Auth auth = auth_for(caller);
  switch (method) {
    case kJoin: {
      ddp::v1::JoinRequest r;
      *r.mutable_auth() = auth;
      r.set_node_rank(in.ConsumeIntegralInRange(-2, 2));
      r.set_local_world_size(in.ConsumeIntegralInRange(0, 8));
      const int host = in.ConsumeIntegralInRange(0, 2);
      r.set_hostname(kHosts[host]);
      if (in.ConsumeBool()) r.set_address(std::string(kHosts[host]) + ".addr");
      r.set_master_port(in.ConsumeIntegralInRange(0, 3));
      return r.SerializeAsString();
    }
    case kHeartbeat: {
      ddp::v1::HeartbeatRequest r;
      *r.mutable_auth() = auth;
      r.set_round(round());
      r.set_group_rank(rank());
      r.set_hold_ms(in.ConsumeIntegralInRange<std::uint32_t>(0, 60));
      r.set_heard_end(in.ConsumeBool());
      return r.SerializeAsString();
    }
    case kReportFailure: {
      ddp::v1::ReportFailureRequest r;
      *r.mutable_auth() = auth;
      r.set_round(round());
      r.set_group_rank(rank());
      std::string report = in.ConsumeRandomLengthString(64);
      for (char& c : report)
        c = static_cast<char>(c & 0x7f);  // a proto3 string is UTF-8, else undecodable
      r.set_report(report);
      r.set_exit_code(in.ConsumeIntegral<std::int32_t>());
      return r.SerializeAsString();
    }
    case kLeave: {
      ddp::v1::LeaveRequest r;
      *r.mutable_auth() = auth;
      r.set_round(round());
      r.set_group_rank(rank());
      r.set_exit_code(in.ConsumeIntegralInRange(0, 2));
      return r.SerializeAsString();
    }
    case kSet: {
      ddp::v1::SetRequest r;
      *r.mutable_auth() = auth;
      r.set_key(key());
      r.set_value(value());
      return r.SerializeAsString();
    }
    case kGet: {
      ddp::v1::GetRequest r;
      *r.mutable_auth() = auth;
      r.set_key(key());
      r.set_wait(in.ConsumeBool());
      r.set_timeout_ms(timeout());
      return r.SerializeAsString();
    }
    case kAdd: {
      ddp::v1::AddRequest r;
      *r.mutable_auth() = auth;
      r.set_key(key());
      r.set_delta(in.ConsumeBool() ? in.ConsumeIntegral<std::int64_t>()
                                   : in.ConsumeIntegralInRange(-3, 3));
      return r.SerializeAsString();
    }
    case kCompareSet: {
      ddp::v1::CompareSetRequest r;
      *r.mutable_auth() = auth;
      r.set_key(key());
      r.set_expected(in.ConsumeRandomLengthString(8));
      r.set_desired(value());
      return r.SerializeAsString();
    }
    case kWait: {
      ddp::v1::WaitRequest r;
      *r.mutable_auth() = auth;
      for (int n = in.ConsumeIntegralInRange(0, 3); n > 0; --n) r.add_keys(key());
      r.set_timeout_ms(timeout());
      return r.SerializeAsString();
    }
    case kDelete: {
      ddp::v1::DeleteRequest r;
      *r.mutable_auth() = auth;
      r.set_key(key());
      return r.SerializeAsString();
    }
    case kNumKeys: {
      ddp::v1::NumKeysRequest r;
      *r.mutable_auth() = auth;
      return r.SerializeAsString();
    }
    case kBarrier: {
      ddp::v1::BarrierRequest r;
      *r.mutable_auth() = auth;
      r.set_name(in.ConsumeBool() ? "b0" : (in.ConsumeBool() ? "b1" : key()));
      r.set_rank(rank());
      r.set_world_size(in.ConsumeIntegralInRange(0, 3));
      r.set_timeout_ms(timeout());
      r.set_host(kHosts[in.ConsumeIntegralInRange(0, 2)]);
      return r.SerializeAsString();
    }
    case kHealthCheck: {
      // grpc.health.v1.HealthCheckRequest { string service = 1; }
      const std::string service = in.ConsumeBool() ? "" : "ddp.v1.Rendezvous";
      return service.empty() ? std::string()
                             : std::string("\x0a", 1) + char(service.size()) + service;
    }
    default:
      return in.ConsumeRandomLengthString(16);
  }
}

// After the input: the server still serves a right caller.
void check_still_serving(Fixture& f) {
  auto call_ok = [&](Method method, const std::string& request) {
    Call call;
    call.method = method;
    call.request = buffer_of(request);
    start(f, call, 5s);
    call.wait();
    if (!call.status.ok()) {
      fail(std::string(kPaths[method]) + " after the input: " +
           std::to_string(call.status.error_code()) + " " + call.status.error_message());
    }
    return bytes_of(call.response);
  };
  ddp::v1::NumKeysRequest num_keys;
  *num_keys.mutable_auth() = auth_for(Caller::kRight);
  ddp::v1::NumKeysResponse count;
  if (!count.ParseFromString(call_ok(kNumKeys, num_keys.SerializeAsString())) ||
      count.count() < 0 ||
      count.count() > static_cast<std::int64_t>(make_config().limits.max_keys)) {
    fail("NumKeys after the input: a count outside [0, max_keys]: " + count.ShortDebugString());
  }
  ddp::v1::GetRequest get;
  *get.mutable_auth() = auth_for(Caller::kRight);
  get.set_key("a");
  ddp::v1::GetResponse got;
  if (!got.ParseFromString(call_ok(kGet, get.SerializeAsString())))
    fail("Get after the input: undecodable answer");
  // grpc.health.v1.HealthCheckResponse { ServingStatus status = 1; }, SERVING = 1
  const std::string serving = call_ok(kHealthCheck, "");
  if (serving != std::string("\x08\x01", 2)) fail("Health/Check after the input: not SERVING");
  if (std::string why = f.service.broken_invariant(); !why.empty()) fail("after the input: " + why);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  gpr_set_log_function([](gpr_log_func_args*) {});  // gRPC's and protobuf's own logs (invalid
  google::protobuf::SetLogHandler(nullptr);         // UTF-8 in a string field...): noise here
  grpc::EnableDefaultHealthCheckService(true);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  Fixture f;
  std::deque<std::unique_ptr<Call>> in_flight;
  auto finish = [](Call& call) {
    call.wait();
    check(call);
  };
  while (in.remaining_bytes() > 0) {
    const auto choice = in.ConsumeIntegral<std::uint8_t>();
    auto call = std::make_unique<Call>();
    call->method = static_cast<Method>((choice & 0x0f) % kMethods);
    call->built = (choice & 0x10) != 0;
    const bool await = (choice & 0x20) != 0;
    call->caller = static_cast<Caller>(choice >> 6 == 3 ? in.ConsumeIntegralInRange(0, 3) : 0);
    const auto deadline = std::chrono::milliseconds(in.ConsumeIntegralInRange(1, 50));
    if (call->built) {
      call->request = buffer_of(build_request(call->method, call->caller, in));
    } else {
      const auto length = in.ConsumeIntegralInRange<std::size_t>(0, kMaxMessageBytes + 16);
      call->request = buffer_of(in.ConsumeBytesAsString(length));
    }
    if (in_flight.size() >= kMaxInFlight) {
      finish(*in_flight.front());
      in_flight.pop_front();
    }
    start(f, *call, deadline);
    if (await) {
      finish(*call);
    } else {
      in_flight.push_back(std::move(call));
    }
  }
  for (auto& call : in_flight) finish(*call);
  in_flight.clear();
  check_still_serving(f);
  return 0;
}
