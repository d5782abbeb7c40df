#include "rpc/subcommands.h"

#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <thread>

#include "cli/launch_spec.h"
#include "ddp/common/endpoint.h"
#include "ddp/common/error.h"
#include "ddp/common/flag_file.h"
#include "ddp/common/launcher_log.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "rpc/rendezvous_service.h"
#include "rpc/subcommand_args.h"
#include "worker_group/process.h"

namespace ddp::launcher {
namespace {

// Usage errors as the launcher reports its own.
int parse(CLI::App& app, const std::vector<std::string>& argv) {
  return parse_subcommand_args(
      app, argv, [](const std::string& what) { launcher_log().error("error: {}", what); });
}

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
}

}  // namespace

RendezvousConfig rendezvous_config(const std::string& run_id, const std::string& token,
                                   int min_nodes, int max_nodes, int max_restarts,
                                   const RdzvConf& conf) {
  RendezvousConfig config;
  config.run_id = run_id;
  config.token = token;
  config.min_nodes = min_nodes;
  config.max_nodes = max_nodes;
  config.max_restarts = max_restarts;
  config.join_timeout = to_ms(conf.join_timeout_s);
  config.last_call_timeout = to_ms(conf.last_call_timeout_s);
  config.heartbeat_timeout = to_ms(conf.heartbeat_timeout_s);
  config.limits.max_key_bytes = static_cast<std::size_t>(conf.max_key_bytes);
  config.limits.max_value_bytes = static_cast<std::size_t>(conf.max_value_bytes);
  config.limits.max_keys = static_cast<std::size_t>(conf.max_keys);
  config.limits.max_store_bytes = static_cast<std::size_t>(conf.max_store_bytes);
  config.limits.max_pending_waits = static_cast<std::size_t>(conf.max_pending_waits);
  return config;
}

std::chrono::milliseconds close_time(const RdzvConf& conf) {
  return to_ms(conf.close_timeout_s.value_or(2 * conf.heartbeat_interval_s + 0.5));
}

namespace {

// Serves until the job ends (exit 0 on success, 1 on its final failure) or
// a signal other than SIGCHLD arrives on `signal_fd` (exit 0).
int serve_until_done(RendezvousServer& server, int signal_fd, const RdzvConf& conf) {
  auto& log = launcher_log();
  for (;;) {
    pollfd p{signal_fd, POLLIN, 0};
    int ready = poll(&p, 1, 100);
    if (ready > 0) {
      signalfd_siginfo info{};
      bool stop = false;
      while (read(signal_fd, &info, sizeof(info)) == sizeof(info)) {
        if (info.ssi_signo != SIGCHLD) stop = true;
      }
      if (stop) {
        log.info("rendezvous: stopping on {}", signal_name(static_cast<int>(info.ssi_signo)));
        server.shutdown();
        return 0;
      }
    }
    auto phase = server.service().phase();
    if (phase == RendezvousState::Phase::kSucceeded || phase == RendezvousState::Phase::kFailed) {
      // Let agents read the outcome with their next heartbeats, then stop.
      std::this_thread::sleep_for(close_time(conf));
      log.info("rendezvous: job {}",
               phase == RendezvousState::Phase::kSucceeded ? "succeeded" : "failed");
      server.shutdown();
      return phase == RendezvousState::Phase::kSucceeded ? 0 : 1;
    }
  }
}

}  // namespace

int run_rendezvous_command(const std::vector<std::string>& argv, int signal_fd) {
  CLI::App app{"ddprun rendezvous: the standalone rendezvous daemon for one job",
               "ddprun rendezvous"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  std::string host = "::", run_id, token, nnodes = "1", conf_text, cert, key,
              on_failure = "restart";
  int port = 29400, max_restarts = 0;
  app.add_option("--port", port, "TCP port to listen on (0: any free port, printed)");
  app.add_option("--host", host, "Address to listen on (default: every interface)");
  app.add_option("--run_id,--run-id,--rdzv_id,--rdzv-id", run_id, "The job's run id")->required();
  app.add_option("--rdzv_token,--rdzv-token", token, "Shared secret (or DDP_RDZV_TOKEN)")
      ->envname("DDP_RDZV_TOKEN");
  app.add_option("--nnodes", nnodes, "Nodes in the job: N or MIN:MAX");
  app.add_option("--max_restarts,--max-restarts", max_restarts, "Job-wide restart budget");
  app.add_option("--on_failure,--on-failure", on_failure,
                 "restart | heal: with heal a node whose heartbeats stop is left out of the "
                 "running round, which goes on while --nnodes' minimum remain (as the agents' "
                 "--on_failure)")
      ->check(CLI::IsMember({"restart", "heal"}));
  app.add_option("--rdzv_conf,--rdzv-conf", conf_text,
                 "join_timeout=S,last_call_timeout=S,heartbeat_timeout=S,max_key_bytes=N,...");
  app.add_option("--rdzv_tls_cert,--rdzv-tls-cert", cert, "PEM certificate to serve TLS with");
  app.add_option("--rdzv_tls_key,--rdzv-tls-key", key, "PEM private key for the certificate");
  if (int code = parse(app, argv); code >= 0) return code;

  auto& log = launcher_log();
  try {
    if (token.empty()) {
      log.warn(
          "no --rdzv_token (or DDP_RDZV_TOKEN): the rendezvous is unauthenticated; anyone who can "
          "reach it can join or read its store");
    }
    if (port < 0 || port > 65535)
      throw Error("--port=" + std::to_string(port) + " is not a TCP port");
    if (max_restarts < 0) throw Error("--max_restarts must be >= 0");
    // The server of the c10d form: the agents it serves read --rdzv_conf as torchrun's c10d.
    std::vector<std::string> notices;
    RdzvConf conf = parse_rdzv_conf(conf_text, TorchHandler::kC10d, &notices);
    for (const auto& notice : notices) log.info("{}", notice);
    const NodeRange nodes = parse_nnodes(nnodes);
    RendezvousConfig config =
        rendezvous_config(run_id, token, nodes.min, nodes.max, max_restarts, conf);
    config.heal = on_failure == "heal";
    ServerOptions options;
    options.max_message_bytes = static_cast<int>(conf.max_message_bytes);
    options.host = host;
    options.port = port;
    options.tls_cert = cert;
    options.tls_key = key;
    std::unique_ptr<RendezvousServer> server;
    try {
      server = std::make_unique<RendezvousServer>(config, options);
    } catch (const Error& e) {
      throw Error(std::string("--host/--port: ") + e.what());
    }
    Endpoint shown{host, server->port()};
    // The port line is what scripts (and tests) read to find an ephemeral port.
    std::printf("rendezvous listening on %s\n", shown.to_string().c_str());
    std::fflush(stdout);
    return serve_until_done(*server, signal_fd, conf);
  } catch (const Error& e) {
    log.error("error: {}", e.what());
    return 2;
  }
}

int run_health_command(const std::vector<std::string>& argv) {
  CLI::App app{
      "ddprun health HOST:PORT: query the standard gRPC health service; exit 0 when SERVING",
      "ddprun health"};
  std::string target, ca, service;
  double timeout_s = 5;
  app.add_option("endpoint", target, "HOST:PORT of a rendezvous server")->required();
  app.add_option("--timeout", timeout_s, "Seconds to wait for an answer");
  app.add_option("--service", service, "Service name to ask about (default: the whole server)");
  app.add_option("--rdzv_tls_ca,--rdzv-tls-ca", ca, "PEM CA to verify a TLS server with");
  if (int code = parse(app, argv); code >= 0) return code;
  try {
    Endpoint ep = parse_endpoint(target, 29400, "endpoint");
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    if (!ca.empty()) {
      grpc::SslCredentialsOptions opts;
      opts.pem_root_certs = read_flag_file("--rdzv_tls_ca", ca);
      creds = grpc::SslCredentials(opts);
    }
    auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(ep.to_string(), creds));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + to_ms(timeout_s));
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status status = stub->Check(&ctx, req, &resp);
    if (!status.ok()) {
      std::printf("UNAVAILABLE\n");
      launcher_log().error("health {}: {}", ep.to_string(), status.error_message());
      return 1;
    }
    bool serving = resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
    std::printf("%s\n", serving ? "SERVING" : "NOT_SERVING");
    return serving ? 0 : 1;
  } catch (const Error& e) {
    launcher_log().error("error: {}", e.what());
    return 2;
  }
}

}  // namespace ddp::launcher
