#include "rpc/connection_acceptor.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>

#include "ddp/common/endpoint.h"
#include "ddp/common/error.h"
#include "ddp/common/launcher_log.h"
#include "store/torch_store_protocol.h"

namespace ddp::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// What every HTTP/2 client sends first (RFC 9113, 3.4).
constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
constexpr size_t kPrefaceBytes = sizeof kPreface - 1;
// A connection that has sent part of the preface is looked at again after this.
constexpr auto kPartialRecheck = std::chrono::milliseconds(20);

std::string where(const std::string& host, int port) { return Endpoint{host, port}.to_string(); }

int open_file_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 1 << 30;
  return static_cast<int>(std::min<rlim_t>(limit.rlim_cur, 1 << 30));
}

// The lowest descriptor number left for the process's own use: accept()
// returns the lowest free number, so a connection at or above it means the
// table is nearly full.
int first_reserved_fd(int limit) { return limit - std::min(64, limit / 4); }

int listen_on(const addrinfo* a, int port, std::string& why) {
  int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
  if (fd < 0) {
    why = std::strerror(errno);
    return -1;
  }
  int one = 1, zero = 0;
  // SO_REUSEADDR as gRPC sets it: a port in TIME_WAIT, or held by ddprun's own
  // non-listening reservation, can be listened on. Never SO_REUSEPORT, which
  // would let a second server silently share the port.
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (a->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  sockaddr_storage addr{};
  std::memcpy(&addr, a->ai_addr, a->ai_addrlen);
  if (a->ai_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(static_cast<uint16_t>(port));
  } else {
    reinterpret_cast<sockaddr_in*>(&addr)->sin_port = htons(static_cast<uint16_t>(port));
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), a->ai_addrlen) != 0 ||
      listen(fd, SOMAXCONN) != 0) {
    why = errno == EADDRINUSE      ? "port " + std::to_string(port) + " in use"
          : errno == EADDRNOTAVAIL ? "not a local address"
                                   : std::strerror(errno);
    close(fd);
    return -1;
  }
  return fd;
}

int bound_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                    : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

struct Unready {
  int fd;
  Clock::time_point deadline;
  Clock::time_point next_look;  // after a partial preface: not polled before then
};

enum class Preface { kComplete, kTorchStore, kPartial, kWrong, kClosed };

Preface look_at(int fd, bool serves_store) {
  char buf[kPrefaceBytes];
  ssize_t n = recv(fd, buf, sizeof buf, MSG_PEEK);
  if (n < 0)
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? Preface::kPartial
                                                                     : Preface::kClosed;
  if (n == 0) return Preface::kClosed;
  if (serves_store && torch_store::starts_query(static_cast<std::uint8_t>(buf[0])))
    return Preface::kTorchStore;
  if (std::memcmp(buf, kPreface, static_cast<size_t>(n)) != 0) return Preface::kWrong;
  return static_cast<size_t>(n) == kPrefaceBytes ? Preface::kComplete : Preface::kPartial;
}

}  // namespace

ConnectionAcceptor::ConnectionAcceptor(const Options& options, HandOver hand_over, HandOver store)
    : options_(options), hand_over_(std::move(hand_over)), torch_store_(std::move(store)) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(options.port);
  if (int rc = getaddrinfo(options.host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    throw Error("rendezvous: cannot listen on " + where(options.host, options.port) + ": " +
                gai_strerror(rc));
  }
  std::string why;
  int port = options.port;
  for (addrinfo* a = found; a; a = a->ai_next) {
    int fd = listen_on(a, port, why);
    if (fd < 0) continue;
    listeners_.push_back(fd);
    port = bound_port(fd);  // the same port on every address of the name
  }
  freeaddrinfo(found);
  if (listeners_.empty()) {
    throw Error("rendezvous: cannot listen on " + where(options.host, options.port) + " (" + why +
                ")");
  }
  port_ = port;
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    for (int fd : listeners_) close(fd);
    throw Error(std::string("rendezvous: eventfd: ") + std::strerror(errno));
  }
}

ConnectionAcceptor::~ConnectionAcceptor() {
  stop();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void ConnectionAcceptor::start() {
  thread_ = std::thread([this] { run(); });
}

void ConnectionAcceptor::stop() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
    thread_.join();
  }
  // Closed, so a client connecting after the stop is refused at once instead
  // of waiting in the backlog.
  for (int fd : listeners_) close(fd);
  listeners_.clear();
}

namespace {

// The accept loop's state, on the acceptor's thread: connections accepted
// but not yet handed over (their first bytes decide where they go), and the
// spare descriptor that lets a full process still take a waiting
// connection off the queue.
class AcceptLoop {
 public:
  AcceptLoop(const ConnectionAcceptor::Options& options, const ConnectionAcceptor::HandOver& grpc,
             const ConnectionAcceptor::HandOver& store, const std::vector<int>& listeners,
             int wake_fd)
      : options_(options),
        grpc_(grpc),
        store_(store),
        listeners_(listeners),
        wake_fd_(wake_fd),
        spare_(open("/dev/null", O_RDONLY | O_CLOEXEC)),
        limit_(open_file_limit()),
        reserved_from_(first_reserved_fd(limit_)) {}
  ~AcceptLoop() {
    for (const Unready& u : unready_) close(u.fd);
    if (spare_ >= 0) close(spare_);
  }
  // Until stop() wakes it or poll fails.
  void run();

 private:
  void drop_connection(int fd);
  void accept_all(int listener);
  // Hands over or closes the polled connections that said enough; drops
  // those past their handshake deadline.
  void sort_out(const std::vector<pollfd>& fds, const std::vector<size_t>& polled);

  const ConnectionAcceptor::Options& options_;
  const ConnectionAcceptor::HandOver& grpc_;
  const ConnectionAcceptor::HandOver& store_;
  const std::vector<int>& listeners_;
  const int wake_fd_;
  std::deque<Unready> unready_;
  int spare_;
  const int limit_, reserved_from_;
  bool warned_ = false;  // once per stretch of refusals
};

void AcceptLoop::drop_connection(int fd) {
  if (!warned_) {
    launcher_log().warn(
        "rendezvous: out of file descriptors (open-file limit {}): refusing connections until "
        "some close",
        limit_);
    warned_ = true;
  }
  close(fd);
}

void AcceptLoop::accept_all(int listener) {
  for (;;) {
    int fd = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        // The spare makes room for one accept, so the waiting connection is
        // taken off the queue (and closed) instead of making poll spin.
        if (spare_ >= 0) close(spare_);
        int dropped = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
        if (dropped >= 0) drop_connection(dropped);
        spare_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (dropped >= 0) continue;
        return;
      }
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      return;  // EAGAIN, or an error that the next poll will report again
    }
    if (fd >= reserved_from_) {
      drop_connection(fd);
      continue;
    }
    warned_ = false;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    // A client that spoke at once (a torch client's first query, often the
    // HTTP/2 preface too) is handed over now instead of after a poll.
    switch (look_at(fd, static_cast<bool>(store_))) {
      case Preface::kComplete:
        grpc_(fd);
        continue;
      case Preface::kTorchStore:
        store_(fd);
        continue;
      case Preface::kWrong:
      case Preface::kClosed:
        close(fd);
        continue;
      case Preface::kPartial:
        break;
    }
    if (unready_.size() >= options_.max_unready) {
      close(unready_.front().fd);
      unready_.pop_front();
    }
    const auto now = Clock::now();
    unready_.push_back({fd, now + std::chrono::milliseconds(options_.handshake_timeout_ms), now});
  }
}

void AcceptLoop::sort_out(const std::vector<pollfd>& fds, const std::vector<size_t>& polled) {
  const auto later = Clock::now();
  std::vector<bool> done(unready_.size(), false);
  for (size_t k = 0; k < polled.size(); ++k) {
    if (!fds[1 + listeners_.size() + k].revents) continue;
    Unready& u = unready_[polled[k]];
    switch (look_at(u.fd, static_cast<bool>(store_))) {
      case Preface::kComplete:
        grpc_(u.fd);
        done[polled[k]] = true;
        break;
      case Preface::kTorchStore:
        store_(u.fd);
        done[polled[k]] = true;
        break;
      case Preface::kPartial:
        u.next_look = later + kPartialRecheck;
        break;
      case Preface::kWrong:
      case Preface::kClosed:
        close(u.fd);
        done[polled[k]] = true;
        break;
    }
  }
  std::deque<Unready> kept;
  for (size_t i = 0; i < unready_.size(); ++i) {
    if (done[i]) continue;
    if (unready_[i].deadline <= later) {
      close(unready_[i].fd);
      continue;
    }
    kept.push_back(unready_[i]);
  }
  unready_.swap(kept);
}

void AcceptLoop::run() {
  std::vector<pollfd> fds;
  std::vector<size_t> polled;  // index in `unready_` of fds[1 + listeners + i]
  for (;;) {
    const auto now = Clock::now();
    fds.clear();
    polled.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    for (int fd : listeners_) fds.push_back({fd, POLLIN, 0});
    auto next = now + std::chrono::hours(1);
    for (size_t i = 0; i < unready_.size(); ++i) {
      next = std::min(next, unready_[i].deadline);
      if (unready_[i].next_look <= now) {
        fds.push_back({unready_[i].fd, POLLIN, 0});
        polled.push_back(i);
      } else {
        next = std::min(next, unready_[i].next_look);
      }
    }
    auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1;
    int ready = poll(fds.data(), fds.size(), static_cast<int>(std::max<long long>(wait_ms, 0)));
    if (ready < 0 && errno != EINTR) return;
    if (fds[0].revents) return;  // stop()
    sort_out(fds, polled);
    // Accepting last: it may drop the oldest unready connection, which would
    // move the indices in `polled`.
    for (size_t i = 0; i < listeners_.size(); ++i) {
      if (fds[1 + i].revents) accept_all(listeners_[i]);
    }
  }
}

}  // namespace

void ConnectionAcceptor::run() {
  AcceptLoop loop(options_, hand_over_, torch_store_, listeners_, wake_fd_);
  loop.run();
}

}  // namespace ddp::launcher
