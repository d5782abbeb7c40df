#include "heal/quorum.h"

#include <algorithm>
#include <sstream>

#include "core/process_identity.h"
#include "ddp/common/error.h"

namespace ddp::detail {

std::string encode(const Arrival& a) {
  return std::to_string(a.id) + " " + std::to_string(a.node) + " " + std::to_string(a.committed) +
         " " + a.proc;
}

Arrival decode_arrival(const std::string& text, const std::string& what) {
  std::istringstream in(text);
  Arrival a;
  if (!(in >> a.id >> a.node >> a.committed) || a.id < 0 || a.node < 0) {
    throw Error("heal: " + what + " holds '" + text + "', not a member's arrival");
  }
  std::getline(in >> std::ws, a.proc);
  return a;
}

std::string encode(const std::vector<Arrival>& arrivals) {
  std::string text;
  for (const Arrival& a : arrivals) text += encode(a) + "\n";
  return text;
}

std::vector<Arrival> decode_arrivals(const std::string& text, const std::string& what) {
  std::vector<Arrival> arrivals;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) arrivals.push_back(decode_arrival(line, what));
  }
  return arrivals;
}

DeathOracle local_death_oracle() {
  const std::string here = pid_namespace_of(process_identity());
  return [here](const std::string& proc) {
    if (here.empty() || pid_namespace_of(proc) != here) return false;
    const pid_t pid = static_cast<pid_t>(std::stol(proc.substr(proc.rfind(' ') + 1)));
    return pid != getpid() && process_exited(pid);
  };
}

bool quorum_ready(const std::vector<Arrival>& previous, const std::map<int, Arrival>& arrived,
                  const DeathOracle& is_dead, std::chrono::steady_clock::time_point now,
                  std::chrono::steady_clock::time_point deadline) {
  if (now >= deadline) return true;
  return std::all_of(previous.begin(), previous.end(), [&](const Arrival& member) {
    auto it = arrived.find(member.id);
    // A relaunched process arrives under its predecessor's id: that counts.
    return it != arrived.end() || is_dead(member.proc);
  });
}

bool awaits_relaunch(const std::vector<Arrival>& previous, const std::map<int, Arrival>& arrived,
                     const DeathOracle& is_dead, std::chrono::steady_clock::time_point now,
                     std::chrono::steady_clock::time_point until) {
  if (now >= until) return false;
  return std::any_of(previous.begin(), previous.end(), [&](const Arrival& member) {
    if (!is_dead(member.proc)) return false;
    auto it = arrived.find(member.id);
    return it == arrived.end() || is_dead(it->second.proc);
  });
}

std::vector<Arrival> quorum_members(const std::map<int, Arrival>& arrived,
                                    const DeathOracle& is_dead) {
  std::vector<Arrival> members;
  for (const auto& [id, a] : arrived) {
    if (!is_dead(a.proc)) members.push_back(a);
  }
  std::sort(members.begin(), members.end(), [](const Arrival& x, const Arrival& y) {
    return x.node != y.node ? x.node < y.node : x.id < y.id;
  });
  return members;
}

EpochChange epoch_change(const std::vector<Arrival>& before, const std::vector<Arrival>& after) {
  EpochChange change;
  auto find = [](const std::vector<Arrival>& in, int id) {
    return std::find_if(in.begin(), in.end(), [&](const Arrival& a) { return a.id == id; });
  };
  for (const Arrival& a : before) {
    if (find(after, a.id) == after.end()) change.left.push_back(a.id);
  }
  for (const Arrival& a : after) {
    auto was = find(before, a.id);
    if (was == before.end()) {
      change.arrived.push_back(a.id);
    } else if (was->proc != a.proc) {
      change.replaced.push_back(a.id);
    }
  }
  std::sort(change.left.begin(), change.left.end());
  std::sort(change.arrived.begin(), change.arrived.end());
  std::sort(change.replaced.begin(), change.replaced.end());
  return change;
}

int boundaries_to_skip(std::chrono::nanoseconds elapsed, int boundaries,
                       std::chrono::nanoseconds interval, int previous) {
  const std::int64_t most =
      std::min<std::int64_t>(2 * std::max(previous, 0) + 1, kMaxSkippedBoundaries);
  if (boundaries <= 0) return static_cast<int>(most);
  const auto per_boundary = elapsed / boundaries;
  if (per_boundary.count() <= 0) return static_cast<int>(most);
  const auto fit = interval / per_boundary;  // boundaries per interval
  return static_cast<int>(std::clamp<std::int64_t>(fit - 1, 0, most));
}

MemberSet member_set(std::uint64_t epoch, const std::vector<Arrival>& members) {
  MemberSet set;
  set.epoch = epoch;
  for (const Arrival& a : members) set.members.push_back({a.id, a.node});
  return set;
}

}  // namespace ddp::detail
