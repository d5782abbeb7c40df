#pragma once
// HOST:PORT endpoints as users write them: "node0:29400", "10.0.0.1",
// "[::1]:29400", "[fe80::1%eth0]:1234". Pure parsing, unit-tested.

#include <string>

namespace ddp {

struct Endpoint {
  std::string host;  // without brackets
  int port = 0;

  // "host:port", with brackets around IPv6 literals.
  std::string to_string() const;
  bool is_ipv6_literal() const { return host.find(':') != std::string::npos; }
};

// Parses `text`; a missing port becomes `default_port`. Throws ddp::Error
// naming `what` (e.g. "--rdzv_endpoint") and the text when it is malformed.
Endpoint parse_endpoint(const std::string& text, int default_port, const std::string& what);

// The local address that routes to `remote` (UDP connect + getsockname; no
// packet is sent). Throws ddp::Error naming the endpoint when it cannot be
// resolved or routed.
std::string local_address_towards(const Endpoint& remote);

// Whether `address` (a numeric address) is a loopback one (127.0.0.0/8, ::1).
bool is_loopback_address(const std::string& address);

// The first address of an up interface other than loopback, IPv4 first;
// "" when there is none. What this machine can tell its peers when the name
// they reach it by resolves to loopback here (Debian's 127.0.1.1 line).
std::string first_non_loopback_address();

// Whether `host` names this machine: its hostname, or a name or address that
// resolves to one of its own addresses (loopback included). torchrun's rule
// for which node hosts a c10d rendezvous. Resolution failure: false.
bool is_local_host(const std::string& host);

}  // namespace ddp
