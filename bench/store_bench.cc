// store_bench: N clients of one torch.distributed TCPStore server (ddprun's
// own store, or torch's TCPStore server), as N ranks bootstrap a job.
//
//   store_bench --port P [--host 127.0.0.1] [--clients 1024] [--timeout_s 300]
//
// Every client speaks torch 2.x's wire protocol over its own connection,
// from one thread (epoll, non-blocking sockets), in four phases timed apart:
//   connect   connect, VALIDATE with torch's magic, PING (answered)
//   set       SET its own key, then WAIT for the common key and its
//             neighbour's (client i+1's), pipelined in one write; once every
//             client's bytes are out, client 0 SETs the common key (the NCCL
//             id pattern: rank 0 publishes, everyone waits for it)
//   wake      until every WAIT is answered
//   get       GET the common key and the neighbour's, every value checked
// Connections are opened at most --window at a time (torch's clients all
// retry a refused connect; a refusal is counted and retried here too).
// Client i connects from 127.0.0.(2 + i / 16384), port 10000 + i % 16384
// (the kernel's search for a free ephemeral port would cost more than the
// rest of the client, and one address's ephemeral ports would bound N).
//
// Prints one JSON line: the phases' seconds, the total, refusals. Exits 1
// naming the client and what went wrong (a wrong value, a closed
// connection, the deadline), 2 on a bad flag.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "store/torch_store_protocol.h"

namespace {

namespace wire = ddp::launcher::torch_store;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string host = "127.0.0.1";
  int port = 0;
  int clients = 1024;
  int window = 512;
  double timeout_s = 300;
};

// What a client waits for next.
enum class Await { kConnect, kPing, kWritten, kWake, kGets, kDone };

struct Client {
  int fd = -1;
  Await await = Await::kConnect;
  std::string out;  // bytes not yet written
  std::string in;   // bytes read, not yet parsed
  int gets_left = 0;
};

std::string key_of(int i) { return "bench/rank/" + std::to_string(i); }
std::string value_of(int i) {
  return "address-of-rank-" + std::to_string(i) + "-" + std::string(32, 'x');
}
// Client i connects from 127.0.0.(2 + i / kPerSource), port kFirstPort + i % kPerSource.
constexpr int kPerSource = 16384;
constexpr int kFirstPort = 10000;  // below the ephemeral range, where listeners get ports
const std::string kCommonKey = "bench/nccl_unique_id";
const std::string kCommonValue(128, '\x5a');  // an NCCL unique id is 128 bytes

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "store_bench: %s\n", why.c_str());
  std::exit(1);
}

std::string query(wire::Op op, std::vector<std::string> keys, std::vector<std::string> values = {},
                  std::uint32_t nonce = 0) {
  wire::Query q;
  q.op = op;
  q.keys = std::move(keys);
  q.values = std::move(values);
  q.nonce = nonce;
  return wire::encode(q, wire::Dialect::kModern);
}

class Load {
 public:
  explicit Load(const Options& options) : opt_(options), clients_(options.clients) {
    epoll_ = epoll_create1(EPOLL_CLOEXEC);
    if (epoll_ < 0) fail(std::string("epoll_create1: ") + std::strerror(errno));
    deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(opt_.timeout_s));
  }

  void run() {
    const auto start = Clock::now();
    connect_all();
    const auto connected = Clock::now();
    for (int i = 0; i < opt_.clients; ++i) {
      const int next = (i + 1) % opt_.clients;
      send(i,
           query(wire::Op::kSet, {key_of(i)}, {value_of(i)}) +
               query(wire::Op::kWait, {kCommonKey, key_of(next)}),
           Await::kWritten);
    }
    drive(Await::kWritten);
    send(0, query(wire::Op::kSet, {kCommonKey}, {kCommonValue}), Await::kWake);
    for (int i = 1; i < opt_.clients; ++i) {
      clients_[i].await = Await::kWake;
      parse(i);  // an answer may have come before its phase
    }
    const auto set = Clock::now();
    drive(Await::kWake);
    const auto woken = Clock::now();
    for (int i = 0; i < opt_.clients; ++i) {
      clients_[i].gets_left = 2;
      send(i,
           query(wire::Op::kGet, {kCommonKey}) +
               query(wire::Op::kGet, {key_of((i + 1) % opt_.clients)}),
           Await::kGets);
    }
    drive(Await::kGets);
    const auto done = Clock::now();
    auto s = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double>(b - a).count();
    };
    std::printf(
        "{\"clients\": %d, \"connect_s\": %.4f, \"set_s\": %.4f, \"wake_s\": %.4f, "
        "\"get_s\": %.4f, \"total_s\": %.4f, \"refused\": %d}\n",
        opt_.clients, s(start, connected), s(connected, set), s(set, woken), s(woken, done),
        s(start, done), refused_);
    for (Client& c : clients_) close(c.fd);
  }

 private:
  // Opens every connection, --window at a time, through VALIDATE and PING.
  void connect_all() {
    int next = 0;
    while (true) {
      while (next < opt_.clients && in_flight_ < opt_.window) open(next++);
      if (next == opt_.clients && in_flight_ == 0) return;
      poll_once();
    }
  }

  void open(int i) {
    Client& c = clients_[i];
    c.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) fail("client " + std::to_string(i) + ": socket: " + std::strerror(errno));
    // A source address and port of its own: the kernel's search for a free
    // ephemeral port would otherwise cost more than the rest of the client.
    const int one = 1;
    setsockopt(c.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // past rounds' TIME_WAIT
    setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in source{};
    source.sin_family = AF_INET;
    source.sin_addr.s_addr = htonl(0x7f000002u + static_cast<std::uint32_t>(i / kPerSource));
    source.sin_port = htons(static_cast<std::uint16_t>(kFirstPort + i % kPerSource));
    if (bind(c.fd, reinterpret_cast<sockaddr*>(&source), sizeof source) != 0)
      fail("client " + std::to_string(i) + ": bind: " + std::strerror(errno));
    sockaddr_in server{};
    server.sin_family = AF_INET;
    server.sin_port = htons(static_cast<std::uint16_t>(opt_.port));
    if (inet_pton(AF_INET, opt_.host.c_str(), &server.sin_addr) != 1)
      fail("--host " + opt_.host + " is not an IPv4 address");
    if (connect(c.fd, reinterpret_cast<sockaddr*>(&server), sizeof server) != 0 &&
        errno != EINPROGRESS)
      fail("client " + std::to_string(i) + ": connect: " + std::strerror(errno));
    c.await = Await::kConnect;
    c.out = query(wire::Op::kValidate, {}, {}, wire::kValidationMagic) +
            query(wire::Op::kPing, {}, {}, static_cast<std::uint32_t>(i));
    c.in.clear();
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT;
    ev.data.u32 = static_cast<std::uint32_t>(i);
    if (epoll_ctl(epoll_, EPOLL_CTL_ADD, c.fd, &ev) != 0)
      fail(std::string("epoll_ctl: ") + std::strerror(errno));
    ++in_flight_;
  }

  void send(int i, std::string bytes, Await then) {
    Client& c = clients_[i];
    c.out += bytes;
    c.await = then;
    flush(i);
    parse(i);
    if (!c.out.empty()) watch(i, EPOLLIN | EPOLLOUT);
  }

  void watch(int i, std::uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u32 = static_cast<std::uint32_t>(i);
    epoll_ctl(epoll_, EPOLL_CTL_MOD, clients_[i].fd, &ev);
  }

  // Runs the loop until no client waits for `phase`.
  void drive(Await phase) {
    pending_ = 0;
    for (const Client& c : clients_) pending_ += c.await == phase ? 1 : 0;
    phase_ = phase;
    while (pending_ > 0) poll_once();
  }

  void poll_once() {
    if (Clock::now() > deadline_) {
      int behind = -1;
      for (std::size_t i = 0; i < clients_.size() && behind < 0; ++i)
        if (clients_[i].await == (phase_ == Await::kDone ? Await::kPing : phase_) ||
            clients_[i].await == Await::kConnect)
          behind = static_cast<int>(i);
      fail("the deadline (--timeout_s) passed in the " + phase_name() + " phase (client " +
           std::to_string(behind) + " among those behind)");
    }
    epoll_event events[1024];
    const int n = epoll_wait(epoll_, events, 1024, 100);
    if (n < 0 && errno != EINTR) fail(std::string("epoll_wait: ") + std::strerror(errno));
    for (int k = 0; k < n; ++k) handle(static_cast<int>(events[k].data.u32), events[k].events);
  }

  void handle(int i, std::uint32_t events) {
    Client& c = clients_[i];
    if (c.await == Await::kConnect) {
      int error = 0;
      socklen_t len = sizeof error;
      getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &error, &len);
      if (error == ECONNREFUSED || error == ECONNRESET || error == ETIMEDOUT) {
        // torch's client retries a refused connect; so do we, within reason.
        if (++refused_ > 10 * opt_.clients)
          fail(std::to_string(refused_) + " connections refused: is the server at --port?");
        epoll_ctl(epoll_, EPOLL_CTL_DEL, c.fd, nullptr);
        close(c.fd);
        --in_flight_;
        open(i);
        return;
      }
      if (error != 0) fail("client " + std::to_string(i) + ": connect: " + std::strerror(error));
      if ((events & EPOLLOUT) == 0) return;
      c.await = Await::kPing;
    }
    if (events & EPOLLOUT) flush(i);
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) read_from(i);
  }

  void flush(int i) {
    Client& c = clients_[i];
    while (!c.out.empty()) {
      const ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
      if (n < 0) fail("client " + std::to_string(i) + ": send: " + std::strerror(errno));
      c.out.erase(0, static_cast<std::size_t>(n));
    }
    watch(i, EPOLLIN);
    if (c.await == Await::kWritten) advance(i, Await::kDone);
  }

  void read_from(int i) {
    Client& c = clients_[i];
    char buf[4096];
    while (true) {
      const ssize_t n = recv(c.fd, buf, sizeof buf, 0);
      if (n > 0) {
        c.in.append(buf, static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
      fail("client " + std::to_string(i) + ": the server closed the connection" +
           (n < 0 ? std::string(": ") + std::strerror(errno) : std::string()));
    }
    parse(i);
  }

  void parse(int i) {
    Client& c = clients_[i];
    if (c.await == Await::kPing && c.in.size() >= 4) {
      std::uint32_t nonce = 0;
      std::memcpy(&nonce, c.in.data(), 4);
      if (nonce != static_cast<std::uint32_t>(i))
        fail("client " + std::to_string(i) + ": PING's answer is not its nonce");
      c.in.erase(0, 4);
      --in_flight_;
      c.await = Await::kDone;
    }
    if (c.await == Await::kWake && !c.in.empty()) {
      if (c.in[0] != static_cast<char>(wire::kStopWaiting))
        fail("client " + std::to_string(i) + ": WAIT's answer is not STOP_WAITING");
      c.in.erase(0, 1);
      advance(i, Await::kDone);
    }
    while (c.await == Await::kGets && c.in.size() >= 8) {
      std::uint64_t len = 0;
      std::memcpy(&len, c.in.data(), 8);
      if (c.in.size() < 8 + len) break;
      const std::string value = c.in.substr(8, len);
      c.in.erase(0, 8 + len);
      const bool common = c.gets_left == 2;
      const std::string& expected = common ? kCommonValue : value_of((i + 1) % opt_.clients);
      if (value != expected)
        fail("client " + std::to_string(i) + ": GET " +
             (common ? kCommonKey : key_of((i + 1) % opt_.clients)) + " returned a wrong value");
      if (--c.gets_left == 0) advance(i, Await::kDone);
    }
  }

  std::string phase_name() const {
    switch (phase_) {
      case Await::kWritten:
        return "set";
      case Await::kWake:
        return "wake";
      case Await::kGets:
        return "get";
      default:
        return "connect";
    }
  }

  void advance(int i, Await next) {
    if (clients_[i].await == phase_ && pending_ > 0) --pending_;
    clients_[i].await = next;
  }

  Options opt_;
  std::vector<Client> clients_;
  int epoll_ = -1;
  int in_flight_ = 0;
  int refused_ = 0;
  int pending_ = 0;
  Await phase_ = Await::kDone;
  Clock::time_point deadline_;
};

// Room for every client's descriptor: the soft limit raised to the hard one.
void raise_open_files(int clients) {
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  const rlim_t need = static_cast<rlim_t>(clients) + 64;
  if (lim.rlim_max < need) {
    lim.rlim_max = need;  // root may raise the hard limit
  }
  lim.rlim_cur = std::max(lim.rlim_cur, need);
  if (setrlimit(RLIMIT_NOFILE, &lim) != 0) {
    std::fprintf(stderr, "store_bench: --clients %d needs %llu open files (RLIMIT_NOFILE): %s\n",
                 clients, static_cast<unsigned long long>(need), std::strerror(errno));
    std::exit(2);
  }
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "store_bench: %s\nusage: store_bench --port P [--host 127.0.0.1] [--clients N] "
               "[--window W] [--timeout_s S]\n",
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
      if (flag == "--host")
        o.host = value;
      else if (flag == "--port")
        o.port = std::stoi(value);
      else if (flag == "--clients")
        o.clients = std::stoi(value);
      else if (flag == "--window")
        o.window = std::stoi(value);
      else if (flag == "--timeout_s")
        o.timeout_s = std::stod(value);
      else
        usage("unknown flag " + flag);
    } catch (const std::logic_error&) {
      usage(flag + " " + value + " is not a number");
    }
  }
  if (o.port <= 0 || o.port > 65535) usage("--port must be 1-65535");
  if (o.clients < 2 || o.clients > (1 << 20)) usage("--clients must be 2-1048576");
  if (o.window < 1) usage("--window must be at least 1");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse_args(argc, argv);
  raise_open_files(options.clients);
  Load(options).run();
  return 0;
}
