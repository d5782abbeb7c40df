// RendezvousServer: the gRPC server around RendezvousService, its TLS or
// plaintext listener (our acceptor), and the torch store sharing its port.

#include <absl/synchronization/mutex.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_posix.h>

#include "ddp/common/endpoint.h"
#include "ddp/common/error.h"
#include "ddp/common/flag_file.h"
#include "rpc/rendezvous_service.h"

namespace ddp::launcher {
namespace {

// TLS credentials from --rdzv_tls_cert/--rdzv_tls_key; nullptr for plaintext.
std::shared_ptr<grpc::ServerCredentials> tls_credentials(const ServerOptions& options) {
  if (options.tls_cert.empty() && options.tls_key.empty()) return nullptr;
  if (options.tls_cert.empty() || options.tls_key.empty()) {
    throw Error("--rdzv_tls_cert and --rdzv_tls_key must be given together");
  }
  // gRPC's TLS acceptor cannot share its port with a plaintext protocol.
  if (options.torch_store)
    throw Error("rendezvous: the torch store is served with plaintext only, not TLS");
  // Clients are authenticated by the run token; TLS gives confidentiality and the
  // server's identity, so client certificates are not requested.
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_key_cert_pairs.push_back({read_flag_file("--rdzv_tls_key", options.tls_key),
                                    read_flag_file("--rdzv_tls_cert", options.tls_cert)});
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

RendezvousServer::RendezvousServer(const RendezvousConfig& config, const ServerOptions& options)
    : service_(std::make_unique<RendezvousService>(config)) {
  const std::shared_ptr<grpc::ServerCredentials> creds = tls_credentials(options);
  // Debian's Abseil is built without NDEBUG, so every absl::Mutex lock inside
  // gRPC also updates the deadlock detector's process-wide lock graph; with a
  // thousand connections that is most of the server's CPU (1024 ranks' Set,
  // Get and barrier: 1.8 s with it, 0.5 s without). It is a debugging aid, so
  // the process that serves runs without it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // Without this gRPC sets SO_REUSEPORT and a second server could silently share the port.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // A TLS connection that never completes its handshake (a port scanner, a
  // client holding sockets open to use up descriptors) is dropped after
  // handshake_timeout_ms (plaintext ones by the acceptor), and one idle for
  // 10 minutes is closed (a client reconnects on its next call), so held-open
  // connections cannot pile up.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, options.handshake_timeout_ms);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 10 * 60 * 1000);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.RegisterService(service_.get());
  if (creds == nullptr) {
    // Plaintext: our own acceptor hands connections to the server (it keeps
    // accepting after the descriptors run out; see connection_acceptor.h).
    ConnectionAcceptor::Options accept_options;
    accept_options.host = options.host;
    accept_options.port = options.port;
    accept_options.handshake_timeout_ms = options.handshake_timeout_ms;
    ConnectionAcceptor::HandOver to_store;
    try {
      if (options.torch_store) {
        // The program's store: each round's workers find it empty, before any
        // node learns that the round formed (so before any worker starts).
        torch_store_ = std::make_unique<TorchStore>(TorchStore::Options{
            config.limits, static_cast<std::size_t>(options.max_message_bytes)});
        service_->on_round_formed([store = torch_store_.get()](std::int64_t) { store->clear(); });
        to_store = [store = torch_store_.get()](int fd) { store->adopt(fd); };
      }
      acceptor_ = std::make_unique<ConnectionAcceptor>(
          accept_options, [this](int fd) { grpc::AddInsecureChannelFromFd(server_.get(), fd); },
          to_store);
    } catch (const Error&) {
      service_->stop();
      throw;
    }
    port_ = acceptor_->port();
    server_ = builder.BuildAndStart();
    if (!server_) {
      service_->stop();
      throw Error("rendezvous: cannot start the gRPC server");
    }
    if (torch_store_) torch_store_->start();
    acceptor_->start();
  } else {
    const std::string address = Endpoint{options.host, options.port}.to_string();
    builder.AddListeningPort(address, creds, &port_);
    server_ = builder.BuildAndStart();
    if (!server_ || port_ == 0) {
      service_->stop();
      throw Error("rendezvous: cannot listen on " + address +
                  (options.port != 0 ? " (port " + std::to_string(options.port) +
                                           " in use, or not a local address)"
                                     : " (not a local address)"));
    }
  }
  server_->GetHealthCheckService()->SetServingStatus(true);
}

RendezvousServer::~RendezvousServer() { shutdown(); }

void RendezvousServer::shutdown() {
  std::call_once(shutdown_once_, [this] {
    if (!server_) return;
    server_->GetHealthCheckService()->SetServingStatus(false);
    if (acceptor_) acceptor_->stop();
    if (torch_store_) torch_store_->stop();
    service_->stop();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  });
}

void RendezvousServer::wait() { server_->Wait(); }

}  // namespace ddp::launcher
