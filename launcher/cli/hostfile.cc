#include "cli/hostfile.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <sstream>

#include "cli/text.h"
#include "ddp/common/error.h"

namespace ddp::launcher {
namespace {

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, sep)) parts.push_back(part);
  if (!text.empty() && text.back() == sep) parts.emplace_back();
  return parts;
}

// A count or index: digits only, at most 6 of them; -1 when not one.
int parse_count(const std::string& text) {
  if (text.empty() || text.size() > 6 || text.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  return std::stoi(text);
}

// Why `name` cannot be a host for ssh ("" when it can): letters, digits and
// ".-_" with an optional "USER@", or an IPv6 literal (hex digits, ':' and
// '.'); not starting with '-' (ssh would read an option).
std::string bad_host_name(const std::string& name) {
  if (name.empty()) return "a host name is missing";
  if (name[0] == '-') return "host '" + name + "' starts with '-'";
  if (std::count(name.begin(), name.end(), '@') > 1) return "host '" + name + "' has two '@'";
  const std::string host = name.substr(name.find('@') + 1);
  const bool ipv6 = host.find(':') != std::string::npos;
  if (ipv6 && host.find_first_not_of("0123456789abcdefABCDEF:.") != std::string::npos) {
    return "host '" + name + "' is not an IPv6 address";
  }
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ||
          c == '@' || (ipv6 && c == ':'))) {
      return "host '" + name + "' contains '" + std::string(1, c) + "'";
    }
  }
  return "";
}

// Splits "HOST", "HOST:N", "[IPV6]", "[IPV6]:N", "USER@[IPV6]:N" or a bare
// IPv6 literal ("fd00::2": two colons or more, no slot count) into the host
// as ssh takes it (no brackets) and the slot count's text ("" when absent).
// Returns the problem ("" when fine).
std::string split_host(const std::string& word, std::string& host, std::string& slots_text) {
  const auto open = word.find('[');
  if (open != std::string::npos) {
    const auto close = word.find(']', open);
    if (close == std::string::npos) return "host '" + word + "' has '[' without ']'";
    host = word.substr(0, open) + word.substr(open + 1, close - open - 1);
    const std::string rest = word.substr(close + 1);
    if (!rest.empty() && rest[0] != ':') return "'" + rest + "' follows host '" + host + "'";
    slots_text = rest.empty() ? "" : rest.substr(1);
    if (host.find(':') == std::string::npos) return "'[" + host + "]' is not an IPv6 address";
    return "";
  }
  const std::string after_user = word.substr(word.find('@') + 1);
  if (std::count(after_user.begin(), after_user.end(), ':') >= 2) {
    host = word;  // a bare IPv6 literal: "HOST:N" would be ambiguous, so it has none
    slots_text.clear();
    return "";
  }
  const auto colon = word.find(':');
  host = word.substr(0, colon);
  slots_text = colon == std::string::npos ? "" : word.substr(colon + 1);
  return "";
}

// One hostfile line without its comment: "HOST [slots=N] [max_slots=M]" or "HOST:N".
// Returns the problem ("" when fine).
std::string parse_line(const std::string& line, HostSlots& host) {
  std::istringstream words(line);
  std::string word, first, slots_text;
  words >> word;
  if (std::string why = split_host(word, first, slots_text); !why.empty()) return why;
  const bool counted = word.size() > first.size() + (word.find('[') != std::string::npos ? 2 : 0);
  if (std::string why = bad_host_name(first); !why.empty()) {
    return "'" + line + "' is not a host entry (" + why + "); expected 'HOST [slots=N]' or " +
           "'HOST:N' ('[IPV6]:N' for an IPv6 address with slots)";
  }
  host.name = first;
  host.slots = 1;
  while (words >> word) {
    const auto eq = word.find('=');
    const std::string key = word.substr(0, eq);
    if (eq == std::string::npos || (key != "slots" && key != "max_slots" && key != "max-slots")) {
      return "'" + word + "' is not slots=N (expected 'HOST slots=N' or 'HOST:N')";
    }
    if (key != "slots") continue;  // Open MPI's oversubscription limit: nothing to do here
    if (!slots_text.empty()) return "slots given twice for host '" + first + "'";
    slots_text = word.substr(eq + 1);
  }
  if (!slots_text.empty() || counted) {
    host.slots = parse_count(slots_text);
    if (host.slots < 0) return "slots '" + slots_text + "' is not a number";
  }
  if (host.slots == 0) return "host '" + first + "' has 0 slots (at least 1 is needed)";
  return "";
}

void add_host(std::vector<HostSlots>& hosts, HostSlots host, const std::string& where) {
  for (const auto& h : hosts) {
    if (h.name != host.name) continue;
    throw Error(where + "host '" + host.name + "' is listed twice" +
                (h.line > 0 ? " (first on line " + std::to_string(h.line) + ")" : ""));
  }
  hosts.push_back(std::move(host));
}

// "a@b:0,2" -> host name -> slot indices (empty: the whole host).
std::map<std::string, std::set<int>> parse_selection(const std::string& flag,
                                                     const std::string& text) {
  std::map<std::string, std::set<int>> picked;
  for (const auto& item : split(text, '@')) {
    std::string name, indices;
    if (std::string why = split_host(item, name, indices); !why.empty()) {
      throw Error(flag + "=" + text + ": " + why);
    }
    if (name.empty()) throw Error(flag + "=" + text + ": a host name is missing");
    if (picked.count(name) > 0) throw Error(flag + "=" + text + ": host '" + name + "' twice");
    auto& slots = picked[name];
    if (indices.empty()) continue;
    for (const auto& index : split(indices, ',')) {
      const int i = parse_count(index);
      if (i < 0) throw Error(flag + "=" + text + ": '" + index + "' is not a slot index");
      slots.insert(i);
    }
  }
  return picked;
}

}  // namespace

std::vector<HostSlots> parse_hostfile(const std::string& text, const std::string& source) {
  std::vector<HostSlots> hosts;
  std::istringstream lines(text);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    const std::string where = source + ":" + std::to_string(number) + ": ";
    HostSlots host;
    host.line = number;
    if (std::string why = parse_line(line, host); !why.empty()) throw Error(where + why);
    add_host(hosts, std::move(host), where);
  }
  if (hosts.empty()) throw Error(source + ": no hosts (expected lines 'HOST slots=N')");
  return hosts;
}

std::vector<HostSlots> parse_host_list(const std::string& text) {
  std::vector<HostSlots> hosts;
  for (const auto& item : split(text, ',')) {
    const std::string where = "--hosts=" + text + ": ";
    if (item.find_first_of(" \t") != std::string::npos)
      throw Error(where + "'" + item + "' contains a space");
    HostSlots host;
    if (std::string why = parse_line(item, host); !why.empty()) throw Error(where + why);
    add_host(hosts, std::move(host), where);
  }
  if (hosts.empty()) throw Error("--hosts is empty (expected HOST:SLOTS,...)");
  return hosts;
}

std::vector<HostSlots> select_hosts(std::vector<HostSlots> hosts, const std::string& include,
                                    const std::string& exclude, const std::string& source) {
  if (!include.empty() && !exclude.empty())
    throw Error("--include and --exclude cannot be combined");
  if (include.empty() && exclude.empty()) return hosts;
  const std::string flag = include.empty() ? "--exclude" : "--include";
  const std::string& text = include.empty() ? exclude : include;
  auto picked = parse_selection(flag, text);
  for (const auto& [name, slots] : picked) {
    auto it =
        std::find_if(hosts.begin(), hosts.end(), [&](const auto& h) { return h.name == name; });
    if (it == hosts.end())
      throw Error(flag + "=" + text + ": host '" + name + "' is not in " + source);
    if (!slots.empty() && *slots.rbegin() >= it->slots) {
      throw Error(flag + "=" + text + ": host '" + name + "' has " + std::to_string(it->slots) +
                  " slot(s) in " + source + " (indices 0-" + std::to_string(it->slots - 1) + ")");
    }
  }
  std::vector<HostSlots> kept;
  for (auto& host : hosts) {
    auto it = picked.find(host.name);
    std::set<int> chosen;
    if (!include.empty()) {
      if (it == picked.end()) continue;
      chosen = it->second;
    } else if (it != picked.end()) {
      if (it->second.empty()) continue;
      for (int i = 0; i < host.slots; ++i)
        if (it->second.count(i) == 0) chosen.insert(i);
      if (chosen.empty()) continue;
    }
    host.devices.assign(chosen.begin(), chosen.end());
    kept.push_back(std::move(host));
  }
  if (kept.empty()) throw Error(flag + "=" + text + " leaves no host of " + source);
  return kept;
}

}  // namespace ddp::launcher
