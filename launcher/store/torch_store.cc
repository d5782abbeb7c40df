#include "store/torch_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ddp/common/endpoint.h"
#include "ddp/common/error.h"
#include "ddp/common/launcher_log.h"

namespace ddp::launcher {
namespace {

using torch_store::ClientId;
using torch_store::Outgoing;

constexpr ClientId kWakeId = 0;
constexpr std::size_t kReadChunk =
    64 * 1024;                       // read per wake-up, so one client cannot hog the loop
constexpr std::size_t kBatch = 256;  // queries answered before the loop looks at others

std::string peer_of(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "an unknown peer";
  char host[INET6_ADDRSTRLEN] = {};
  int port = 0;
  if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
  } else {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
  }
  std::string text = host;
  if (text.rfind("::ffff:", 0) == 0)
    text = text.substr(7);  // an IPv4 client of a dual-stack socket
  return Endpoint{text, port}.to_string();
}

}  // namespace

TorchStore::TorchStore(const Options& options)
    : options_(options),
      wire_{options.limits.max_key_bytes, options.limits.max_value_bytes, options.max_query_bytes},
      state_(options.limits) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeId;
  if (epoll_fd_ < 0 || wake_fd_ < 0 || epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0) {
    const std::string why = std::strerror(errno);
    if (epoll_fd_ >= 0) close(epoll_fd_);
    if (wake_fd_ >= 0) close(wake_fd_);
    throw Error("torch store: cannot create its event loop: " + why);
  }
}

TorchStore::~TorchStore() {
  stop();
  close(epoll_fd_);
  close(wake_fd_);
}

void TorchStore::start() {
  thread_ = std::thread([this] { run(); });
}

void TorchStore::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  const std::uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  for (auto& [id, c] : connections_) close(c.fd);
  connections_.clear();
  buffered_ = 0;
  std::lock_guard<std::mutex> lock(mu_);
  for (int fd : adopted_) close(fd);
  adopted_.clear();
}

void TorchStore::adopt(int fd) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      close(fd);
      return;
    }
    adopted_.push_back(fd);
  }
  const std::uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
}

void TorchStore::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  state_.clear();
}

std::size_t TorchStore::num_keys() {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.num_keys();
}

void TorchStore::run() {
  epoll_event events[64];
  for (;;) {
    const int n = epoll_wait(epoll_fd_, events, 64, -1);
    if (n < 0 && errno != EINTR) {
      launcher_log().error("torch store: epoll_wait: {}; no longer serving", std::strerror(errno));
      return;
    }
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 != kWakeId) {
        handle(events[i].data.u64, events[i].events);
        continue;
      }
      std::uint64_t count = 0;
      [[maybe_unused]] ssize_t r = read(wake_fd_, &count, sizeof count);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) return;
      }
      take_adopted();
    }
    close_doomed();
  }
}

void TorchStore::take_adopted() {
  std::vector<int> fds;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fds.swap(adopted_);
  }
  for (int fd : fds) {
    const ClientId id = next_id_++;
    Connection& c = connections_[id];
    c.fd = fd;
    c.id = id;
    c.peer = peer_of(fd);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      c.closing = std::string("epoll_ctl: ") + std::strerror(errno);
      doomed_.push_back(id);
      continue;
    }
    c.watched = EPOLLIN;
  }
}

void TorchStore::handle(ClientId id, std::uint32_t events) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  Connection& c = it->second;
  if (c.closing) return;
  if (events & EPOLLOUT) flush(c);
  if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) read_some(c);
  serve(c);
  watch(c);
}

void TorchStore::read_some(Connection& c) {
  char buf[kReadChunk];
  const ssize_t n = recv(c.fd, buf, sizeof buf, 0);
  if (n > 0) {
    c.in.append(buf, static_cast<std::size_t>(n));
    grow(c, static_cast<std::size_t>(n));
    return;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  // The client closed (a rank that finished, or died): nothing to say.
  c.closing = "";
  doomed_.push_back(c.id);
}

void TorchStore::serve(Connection& c) {
  while (!c.closing && c.out.empty()) {
    if (answer_batch(c) < kBatch) return;
  }
}

std::size_t TorchStore::answer_batch(Connection& c) {
  std::vector<Outgoing> out;
  std::size_t answered = 0, used = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      while (answered < kBatch) {
        torch_store::Query query;
        const std::size_t n =
            torch_store::decode(std::string_view(c.in).substr(used), c.dialect, wire_, query);
        if (n == 0) break;
        used += n;
        ++answered;
        state_.execute(c.id, query, out);
      }
    } catch (const std::exception& e) {  // ProtocolError, or the state's RpcError
      c.closing = e.what();
    }
  }
  c.in.erase(0, used);
  buffered_ -= used;
  if (c.closing) doomed_.push_back(c.id);
  deliver(out);
  return c.closing ? 0 : answered;
}

void TorchStore::deliver(std::vector<Outgoing>& out) {
  for (Outgoing& o : out) {
    auto it = connections_.find(o.client);
    if (it == connections_.end() || it->second.closing) continue;
    Connection& to = it->second;
    to.out += o.bytes;
    grow(to, o.bytes.size());
    flush(to);
    watch(to);
  }
}

void TorchStore::flush(Connection& c) {
  std::size_t sent = 0;
  while (sent < c.out.size()) {
    const ssize_t n = send(c.fd, c.out.data() + sent, c.out.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0 && errno == EINTR) continue;
    if (!c.closing) {
      c.closing = "";  // the client went away mid-answer
      doomed_.push_back(c.id);
    }
    break;
  }
  c.out.erase(0, sent);
  buffered_ -= sent;
}

// Reads while its answers have gone out; otherwise waits until they can.
void TorchStore::watch(Connection& c) {
  if (c.closing) return;
  const std::uint32_t want = c.out.empty() ? EPOLLIN : EPOLLOUT;
  if (want == c.watched) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = c.id;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev) != 0) {
    c.closing = std::string("epoll_ctl: ") + std::strerror(errno);
    doomed_.push_back(c.id);
    return;
  }
  c.watched = want;
}

void TorchStore::grow(Connection& c, std::size_t bytes) {
  buffered_ += bytes;
  const std::size_t limit = std::max(options_.limits.max_store_bytes, 2 * options_.max_query_bytes);
  if (buffered_ <= limit || c.closing) return;
  c.closing = "the store's connections would buffer " + std::to_string(buffered_) +
              " bytes, limit " + std::to_string(limit) +
              " (--rdzv_conf max_store_bytes, at least twice max_message_bytes)";
  doomed_.push_back(c.id);
}

void TorchStore::close_doomed() {
  std::vector<ClientId> doomed;
  doomed.swap(doomed_);
  for (ClientId id : doomed) {
    auto it = connections_.find(id);
    if (it == connections_.end()) continue;
    close_connection(it->second);
    connections_.erase(it);
  }
}

void TorchStore::close_connection(Connection& c) {
  if (c.closing && !c.closing->empty()) {
    launcher_log().warn("torch store: closed the connection from {}: {}", c.peer, *c.closing);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_.forget(c.id);
  }
  buffered_ -= c.in.size() + c.out.size();
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  close(c.fd);
}

}  // namespace ddp::launcher
