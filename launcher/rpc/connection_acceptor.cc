#include "rpc/connection_acceptor.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <unordered_map>

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

// A connection accepted but not yet handed over: its id tells it from a later
// connection that gets the same descriptor number.
struct Unready {
  int fd;
  std::uint32_t id;
  Clock::time_point deadline;
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
// but not yet handed over (their first bytes decide where they go), watched
// by an epoll set (edge-triggered: each arrival of bytes is looked at once,
// so a partial preface waits for the rest without a busy loop, and a loop
// costs the connections that spoke, not all that wait), and the spare
// descriptor that lets a full process still take a waiting connection off
// the queue.
class AcceptLoop {
 public:
  AcceptLoop(const ConnectionAcceptor::Options& options, const ConnectionAcceptor::HandOver& grpc,
             const ConnectionAcceptor::HandOver& store, const std::vector<int>& listeners,
             int wake_fd)
      : options_(options),
        grpc_(grpc),
        store_(store),
        listeners_(listeners),
        epoll_(epoll_create1(EPOLL_CLOEXEC)),
        spare_(open("/dev/null", O_RDONLY | O_CLOEXEC)),
        limit_(open_file_limit()),
        reserved_from_(first_reserved_fd(limit_)) {
    watch(wake_fd, kWake);
    for (std::size_t i = 0; i < listeners_.size(); ++i) watch(listeners_[i], i);
  }
  ~AcceptLoop() {
    for (const auto& [fd, id] : live_) close(fd);
    if (spare_ >= 0) close(spare_);
    if (epoll_ >= 0) close(epoll_);
  }
  // Until stop() wakes it or epoll fails.
  void run();

 private:
  // epoll data: a listener's index, kWake, or an unready connection's id << 32 | fd.
  static constexpr std::uint64_t kWake = ~std::uint64_t{0};

  void watch(int fd, std::uint64_t data, std::uint32_t events = EPOLLIN) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = data;
    epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev);
  }
  void drop_connection(int fd);
  void accept_all(int listener);
  void wait_for_first_bytes(int fd);
  // Hands over or closes a watched connection that said enough; keeps a partial one.
  void sort_out(int fd);
  // Hands a connection that said enough to gRPC or the store, or closes it.
  void route(int fd, Preface said);
  // No longer unready: out of the epoll set and the table (not closed).
  void forget(int fd);
  // Closes the connections past their handshake deadline; the time to wait
  // for the next deadline (-1: none).
  int expire();

  const ConnectionAcceptor::Options& options_;
  const ConnectionAcceptor::HandOver& grpc_;
  const ConnectionAcceptor::HandOver& store_;
  const std::vector<int>& listeners_;
  const int epoll_;
  std::unordered_map<int, std::uint32_t> live_;  // unready fd -> its id
  std::deque<Unready> by_age_;                   // may hold entries no longer live
  std::uint32_t next_id_ = 1;
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
        // taken off the queue (and closed) instead of making epoll spin.
        if (spare_ >= 0) close(spare_);
        int dropped = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
        if (dropped >= 0) drop_connection(dropped);
        spare_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (dropped >= 0) continue;
        return;
      }
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      return;  // EAGAIN, or an error that the next epoll_wait will report again
    }
    if (fd >= reserved_from_) {
      drop_connection(fd);
      continue;
    }
    warned_ = false;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    // A client that spoke at once (a torch client's first query, often the
    // HTTP/2 preface too) is handed over now, never watched.
    const Preface said = look_at(fd, static_cast<bool>(store_));
    if (said == Preface::kPartial) {
      wait_for_first_bytes(fd);
    } else {
      route(fd, said);
    }
  }
}

void AcceptLoop::wait_for_first_bytes(int fd) {
  while (live_.size() >= options_.max_unready && !by_age_.empty()) {
    const Unready oldest = by_age_.front();
    by_age_.pop_front();
    auto it = live_.find(oldest.fd);
    if (it == live_.end() || it->second != oldest.id) continue;
    forget(oldest.fd);
    close(oldest.fd);
  }
  const std::uint32_t id = next_id_++;
  live_[fd] = id;
  by_age_.push_back(
      {fd, id, Clock::now() + std::chrono::milliseconds(options_.handshake_timeout_ms)});
  // Bytes already there are reported at once: a client that spoke before
  // the accept is handed over on this loop's next turn.
  watch(fd, static_cast<std::uint64_t>(id) << 32 | static_cast<std::uint32_t>(fd),
        EPOLLIN | EPOLLRDHUP | EPOLLET);
}

void AcceptLoop::forget(int fd) {
  epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
  live_.erase(fd);
}

void AcceptLoop::sort_out(int fd) {
  const Preface said = look_at(fd, static_cast<bool>(store_));
  if (said == Preface::kPartial)
    return;  // the rest raises the next edge, or the deadline closes it
  forget(fd);
  route(fd, said);
}

void AcceptLoop::route(int fd, Preface said) {
  switch (said) {
    case Preface::kComplete:
      grpc_(fd);
      break;
    case Preface::kTorchStore:
      store_(fd);
      break;
    case Preface::kPartial:
    case Preface::kWrong:
    case Preface::kClosed:
      close(fd);
      break;
  }
}

int AcceptLoop::expire() {
  const auto now = Clock::now();
  while (!by_age_.empty()) {
    const Unready& oldest = by_age_.front();
    auto it = live_.find(oldest.fd);
    if (it == live_.end() || it->second != oldest.id) {
      by_age_.pop_front();  // handed over or closed since
      continue;
    }
    if (oldest.deadline > now) {
      return static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(oldest.deadline - now).count() + 1);
    }
    forget(oldest.fd);
    close(oldest.fd);
    by_age_.pop_front();
  }
  return -1;
}

void AcceptLoop::run() {
  if (epoll_ < 0) {
    launcher_log().error("rendezvous: epoll_create1: {}; not accepting", std::strerror(errno));
    return;
  }
  epoll_event events[256];
  for (;;) {
    const int wait_ms = expire();
    const int n = epoll_wait(epoll_, events, 256, wait_ms);
    if (n < 0 && errno != EINTR) return;
    for (int k = 0; k < n; ++k) {
      const std::uint64_t data = events[k].data.u64;
      if (data == kWake) return;  // stop()
      if (data < listeners_.size()) {
        accept_all(listeners_[data]);
        continue;
      }
      const int fd = static_cast<int>(data & 0xffffffffu);
      auto it = live_.find(fd);
      // An event of a connection this turn already handed over or closed.
      if (it == live_.end() || it->second != static_cast<std::uint32_t>(data >> 32)) continue;
      sort_out(fd);
    }
  }
}

}  // namespace

void ConnectionAcceptor::run() {
  AcceptLoop loop(options_, hand_over_, torch_store_, listeners_, wake_fd_);
  loop.run();
}

}  // namespace ddp::launcher
