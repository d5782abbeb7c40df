#include "ddp/common/endpoint.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstring>

#include "ddp/common/error.h"

namespace ddp {

std::string Endpoint::to_string() const {
  return (is_ipv6_literal() ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Endpoint parse_endpoint(const std::string& text, int default_port, const std::string& what) {
  auto bad = [&](const std::string& why) { return Error(what + "=" + text + ": " + why); };
  if (text.empty()) throw bad("empty endpoint, expected HOST[:PORT]");
  Endpoint ep;
  std::string port_text;
  if (text[0] == '[') {
    auto close = text.find(']');
    if (close == std::string::npos) throw bad("missing ']' after the IPv6 address");
    ep.host = text.substr(1, close - 1);
    std::string rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') throw bad("expected ':PORT' after ']'");
      port_text = rest.substr(1);
      if (port_text.empty()) throw bad("empty port");
    }
  } else {
    auto colon = text.rfind(':');
    if (colon != std::string::npos && text.find(':') != colon) {
      throw bad("IPv6 addresses need brackets, e.g. [::1]:29400");
    }
    ep.host = text.substr(0, colon);
    if (colon != std::string::npos) {
      port_text = text.substr(colon + 1);
      if (port_text.empty()) throw bad("empty port");
    }
  }
  if (ep.host.empty()) throw bad("empty host");
  for (char c : ep.host) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ||
              (c == ':' && text[0] == '[') || (c == '%' && text[0] == '[');
    if (!ok) throw bad(std::string("'") + c + "' cannot appear in a host name");
  }
  if (port_text.empty()) {
    ep.port = default_port;
  } else {
    if (port_text.size() > 5 || port_text.find_first_not_of("0123456789") != std::string::npos) {
      throw bad("port '" + port_text + "' is not a number");
    }
    ep.port = std::stoi(port_text);
    if (ep.port > 65535) throw bad("port " + port_text + " is out of range (0-65535)");
  }
  return ep;
}

std::string local_address_towards(const Endpoint& remote) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  std::string port = std::to_string(remote.port == 0 ? 9 : remote.port);
  int rc = getaddrinfo(remote.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    throw Error("cannot resolve rendezvous host '" + remote.host + "': " + gai_strerror(rc));
  }
  std::string result;
  std::string error = "no address";
  for (addrinfo* ai = res; ai != nullptr && result.empty(); ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      sockaddr_storage local{};
      socklen_t len = sizeof(local);
      char buf[INET6_ADDRSTRLEN] = {};
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
        const void* addr =
            local.ss_family == AF_INET6
                ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
        if (inet_ntop(local.ss_family, addr, buf, sizeof(buf)) != nullptr) result = buf;
      }
    } else {
      error = std::strerror(errno);
    }
    close(fd);
  }
  freeaddrinfo(res);
  if (result.empty())
    throw Error("no route to rendezvous endpoint " + remote.to_string() + ": " + error);
  return result;
}

bool is_local_host(const std::string& host) {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0 && host == name) return true;
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return false;
  bool local = false;
  for (addrinfo* ai = res; ai != nullptr && !local; ai = ai->ai_next) {
    // Binding succeeds only to an address of this machine (EADDRNOTAVAIL
    // otherwise), in whichever network namespace ddprun runs.
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage addr{};
    std::memcpy(&addr, ai->ai_addr, ai->ai_addrlen);
    if (addr.ss_family == AF_INET6) {
      reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = 0;
    } else {
      reinterpret_cast<sockaddr_in*>(&addr)->sin_port = 0;
    }
    local = bind(fd, reinterpret_cast<sockaddr*>(&addr), ai->ai_addrlen) == 0;
    close(fd);
  }
  freeaddrinfo(res);
  return local;
}

bool is_loopback_address(const std::string& address) {
  return address.rfind("127.", 0) == 0 || address == "::1" || address.rfind("::ffff:127.", 0) == 0;
}

std::string first_non_loopback_address() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string v4, v6;
  for (ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr || !(ifa->ifa_flags & IFF_UP) || (ifa->ifa_flags & IFF_LOOPBACK))
      continue;
    char buf[INET6_ADDRSTRLEN] = {};
    if (ifa->ifa_addr->sa_family == AF_INET && v4.empty()) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(ifa->ifa_addr)->sin_addr, buf,
                sizeof(buf));
      v4 = buf;
    } else if (ifa->ifa_addr->sa_family == AF_INET6 && v6.empty()) {
      const auto* in6 = reinterpret_cast<sockaddr_in6*>(ifa->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr)) continue;  // needs a scope to be reached
      inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
      v6 = buf;
    }
  }
  freeifaddrs(list);
  return v4.empty() ? v6 : v4;
}

}  // namespace ddp
