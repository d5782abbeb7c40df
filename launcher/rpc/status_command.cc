#include "rpc/status_command.h"

#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "ddp/common/endpoint.h"
#include "ddp/common/error.h"
#include "ddp/common/flag_file.h"
#include "ddp/v1/rendezvous.grpc.pb.h"
#include "observe/runtime_registry.h"
#include "rpc/status_proto.h"
#include "rpc/subcommand_args.h"

namespace ddp::launcher {
namespace {

struct StatusArgs {
  std::string endpoint, token, token_file, tls_ca, run_id;
  bool json = false, watch = false;
  double interval_s = 1, timeout_s = 2;
};

// Why a Status call failed, in one line naming the endpoint.
std::string explain(const grpc::Status& s, const std::string& endpoint) {
  switch (s.error_code()) {
    case grpc::StatusCode::UNAUTHENTICATED:
      return "the rendezvous at " + endpoint + " refused the token (" + s.error_message() +
             "; give it with DDP_RDZV_TOKEN, --rdzv_token or --rdzv_token_file)";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "the rendezvous at " + endpoint + " refused the request: " + s.error_message();
    case grpc::StatusCode::UNIMPLEMENTED:
      return endpoint +
             " answers gRPC but has no status service: a rendezvous of an older ddprun, or "
             "another server";
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "no ddprun rendezvous answered at " + endpoint + " (" + s.error_message() + ")";
    default:
      return endpoint + " did not answer as a ddprun rendezvous (" + s.error_message() + ")";
  }
}

// One Status call: the job, else how it failed.
struct Answer {
  std::optional<JobStatus> job;
  grpc::Status status;
  std::string endpoint;  // as asked
};

Answer ask(const RuntimeEntry& target, const StatusArgs& a) {
  Endpoint ep = parse_endpoint(target.endpoint, 29400, "endpoint");
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!target.tls_ca.empty()) {
    grpc::SslCredentialsOptions opts;
    opts.pem_root_certs = read_flag_file("--rdzv_tls_ca", target.tls_ca);
    creds = grpc::SslCredentials(opts);
  }
  auto stub = v1::Rendezvous::NewStub(grpc::CreateChannel(ep.to_string(), creds));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<long long>(a.timeout_s * 1000)));
  v1::StatusRequest req;
  req.mutable_auth()->set_run_id(target.run_id);
  req.mutable_auth()->set_token(target.token);
  v1::StatusResponse resp;
  Answer answer{std::nullopt, stub->Status(&ctx, req, &resp), ep.to_string()};
  if (answer.status.ok()) answer.job = job_from_proto(resp, answer.endpoint);
  return answer;
}

AskFailure failure_of(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return AskFailure::kNoAnswer;
    case grpc::StatusCode::UNIMPLEMENTED:
      return AskFailure::kNotARendezvous;
    case grpc::StatusCode::INVALID_ARGUMENT:
      return AskFailure::kAnotherJob;
    case grpc::StatusCode::UNAUTHENTICATED:
      return AskFailure::kRefusedToken;
    default:
      return AskFailure::kOther;
  }
}

// The network namespace of `pid` ("self" for this process) as /proc names
// it, "" when it cannot be read (another user's process).
std::string network_namespace(const std::string& pid) {
  char link[128] = {};
  const std::string path = "/proc/" + pid + "/ns/net";
  const ssize_t n = ::readlink(path.c_str(), link, sizeof(link) - 1);
  return n > 0 ? std::string(link, static_cast<std::size_t>(n)) : "";
}

// A job of the runtime directory that did not answer, with the true reason.
UnansweredJob unanswered(const RuntimeEntry& target, const Answer& answer) {
  const NetworkPlace place{network_namespace(std::to_string(target.pid)),
                           network_namespace("self")};
  return UnansweredJob{target.pid, target.run_id, answer.endpoint,
                       unanswered_reason(failure_of(answer.status), answer.status.error_message(),
                                         target.pid, answer.endpoint, place)};
}

// The jobs to ask: the endpoint given, else this user's jobs on this machine.
std::vector<RuntimeEntry> targets(const StatusArgs& a) {
  std::string token = a.token;
  if (token.empty() && !a.token_file.empty()) {
    token = read_flag_file("--rdzv_token_file", a.token_file);
    token = token.substr(0, token.find('\n'));
  }
  if (!a.endpoint.empty()) {
    return {RuntimeEntry{0, a.run_id, a.endpoint, token, a.tls_ca}};
  }
  std::vector<RuntimeEntry> found = list_runtime_entries();
  for (auto& e : found) {
    if (!token.empty()) e.token = token;
    if (!a.tls_ca.empty()) e.tls_ca = a.tls_ca;
  }
  if (found.empty()) {
    throw Error("no ddprun job of this user runs on this machine (none registered in " +
                runtime_dir() + "); name a rendezvous: ddprun status HOST:PORT");
  }
  return found;
}

// Asks every target once and prints the view: each job that answered, then
// one line (--json: one object) for each registered job that did not. The
// exit code: 0 when some job answered; else 1, a job asked at an endpoint
// given being named on stderr.
int show_once(const std::vector<RuntimeEntry>& jobs, const StatusArgs& a, bool redraw) {
  std::string out, unanswered_lines, errors;
  int shown = 0;
  for (const auto& target : jobs) {
    const Answer answer = ask(target, a);
    if (answer.job) {
      ++shown;
      out += a.json ? status_json(*answer.job)
                    : format_status_table(*answer.job) + (jobs.size() > 1 ? "\n" : "");
    } else if (target.pid == 0) {
      errors += "ddprun status: " + explain(answer.status, answer.endpoint) + "\n";
    } else {
      const UnansweredJob job = unanswered(target, answer);
      unanswered_lines += a.json ? unanswered_json(job) : format_unanswered(job);
    }
  }
  out += unanswered_lines;
  if (redraw) out = "\x1b[H\x1b[2J" + out;  // home, clear: the view is redrawn in place
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);
  std::fputs(errors.c_str(), stderr);
  return shown > 0 ? 0 : 1;
}

}  // namespace

int run_status_command(const std::vector<std::string>& argv) {
  CLI::App app{"ddprun status [ENDPOINT]: what every rank of a running job is doing",
               "ddprun status"};
  StatusArgs a;
  app.add_option("endpoint", a.endpoint,
                 "HOST:PORT of the job's rendezvous (default: this user's jobs on this machine)");
  app.add_flag("--json", a.json, "One JSON object per job per line");
  app.add_flag("--watch", a.watch, "Redraw the view in place every --interval until interrupted");
  app.add_option("--interval", a.interval_s, "Seconds between redraws with --watch")
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--timeout", a.timeout_s, "Seconds to wait for each answer")
      ->check(CLI::Range(0.01, 600.0));
  app.add_option("--rdzv_token,--rdzv-token", a.token, "The job's rendezvous token")
      ->envname("DDP_RDZV_TOKEN");
  app.add_option("--rdzv_token_file,--rdzv-token-file", a.token_file,
                 "Read the token from the first line of this file")
      ->envname("DDP_RDZV_TOKEN_FILE");
  app.add_option("--rdzv_tls_ca,--rdzv-tls-ca", a.tls_ca, "PEM CA to verify a TLS rendezvous");
  app.add_option("--run_id,--rdzv_id", a.run_id, "The job's run id (default: the server's)");
  const int code = parse_subcommand_args(app, argv, [](const std::string& what) {
    std::fprintf(stderr, "ddprun status: error: %s\n", what.c_str());
  });
  if (code >= 0) return code;
  try {
    const std::vector<RuntimeEntry> jobs = targets(a);
    if (!a.watch) return show_once(jobs, a, false);
    // Until SIGINT/SIGTERM (their default action ends the process); each wait is bounded.
    for (;;) {
      show_once(a.endpoint.empty() ? list_runtime_entries() : jobs, a, isatty(STDOUT_FILENO));
      poll(nullptr, 0, static_cast<int>(a.interval_s * 1000));
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "ddprun status: %s\n", e.what());
    return 1;
  }
}

}  // namespace ddp::launcher
