#include "frontend/host_stream.h"

#include <signal.h>

#include <algorithm>
#include <cstdlib>

namespace ddp::launcher {
namespace {

constexpr const char* kReady = "ddprun-ready";
constexpr const char* kLog = "[ddprun] ";

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// A decimal number in [0, 65535], or -1.
int parse_small(const std::string& text) {
  if (text.empty() || text.size() > 5 || text.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  const int n = std::atoi(text.c_str());
  return n <= 65535 ? n : -1;
}

}  // namespace

std::string ready_line(int port) {
  return std::string(kReady) + (port > 0 ? " port=" + std::to_string(port) : "") + "\n";
}

std::optional<int> parse_ready(const std::string& line) {
  if (line == kReady) return 0;
  const std::string with_port = std::string(kReady) + " port=";
  if (!starts_with(line, with_port)) return std::nullopt;
  const int port = parse_small(line.substr(with_port.size()));
  if (port <= 0) return std::nullopt;
  return port;
}

std::string go_line(const std::string& endpoint, const std::string& token) {
  return "go " + endpoint + " " + token + "\n";
}

std::optional<std::pair<std::string, std::string>> parse_go(const std::string& line) {
  if (!starts_with(line, "go ")) return std::nullopt;
  const auto space = line.find(' ', 3);
  if (space == std::string::npos || space == 3 || space + 1 >= line.size()) return std::nullopt;
  return std::make_pair(line.substr(3, space - 3), line.substr(space + 1));
}

std::string alive_line() { return "alive\n"; }

std::string signal_line(int sig) { return "signal " + std::to_string(sig) + "\n"; }

std::optional<int> parse_signal(const std::string& line) {
  if (!starts_with(line, "signal ")) return std::nullopt;
  const int sig = parse_small(line.substr(7));
  if (sig != SIGINT && sig != SIGTERM && sig != SIGHUP && sig != SIGQUIT && sig != SIGUSR1 &&
      sig != SIGUSR2) {
    return std::nullopt;
  }
  return sig;
}

std::vector<std::string> LineBuffer::add(const char* data, size_t size) {
  std::vector<std::string> lines;
  partial_.append(data, size);
  size_t start = 0;
  for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
    lines.push_back(partial_.substr(start, nl - start));
  }
  partial_.erase(0, start);
  return lines;
}

std::optional<std::string> LineBuffer::finish() {
  if (partial_.empty()) return std::nullopt;
  std::string rest = std::move(partial_);
  partial_.clear();
  return rest;
}

std::string label_line(const std::string& line, const std::string& host) {
  if (!starts_with(line, kLog)) return line;
  return "[ddprun " + host + "] " + line.substr(std::string(kLog).size());
}

bool ReportCatcher::add(const std::string& line) {
  if (open_) {
    if (starts_with(line, "  ")) {
      report_.push_back(line);
      return false;
    }
    open_ = false;
  }
  const bool starts = starts_with(line, std::string(kLog) + "worker failed: ") ||
                      starts_with(line, std::string(kLog) + "worker group hung");
  if (!starts || !report_.empty()) return false;
  report_.push_back(line.substr(std::string(kLog).size()));
  open_ = true;
  return true;
}

std::string how_host_ended(const HostEnd& end) {
  return end.code == 255
             ? "the ssh connection to host " + end.host + " failed or was lost (ssh exit code 255)"
             : "the agent on host " + end.host + " ended with exit code " +
                   std::to_string(end.code) + " (its lines above say why)";
}

bool job_can_go_on(const std::vector<HostEnd>& hosts, size_t min_hosts) {
  const auto alive = std::count_if(hosts.begin(), hosts.end(),
                                   [](const HostEnd& h) { return h.ended_at < 0 || h.code == 0; });
  return static_cast<size_t>(alive) >= min_hosts;
}

Verdict decide(const std::vector<HostEnd>& hosts, int signal, size_t min_hosts) {
  Verdict verdict;
  if (signal != 0) {
    verdict.code = 128 + signal;
    return verdict;
  }
  const auto finished = static_cast<size_t>(
      std::count_if(hosts.begin(), hosts.end(), [](const HostEnd& h) { return h.code == 0; }));
  if (min_hosts > 0 && finished >= min_hosts && finished < hosts.size()) {
    // The rendezvous went on without the others (--nnodes=MIN:N): the job finished.
    for (const auto& h : hosts) {
      if (h.code == 0) continue;
      verdict.summary.push_back("the job finished on " + std::to_string(finished) + " of " +
                                std::to_string(hosts.size()) + " hosts without host " + h.host +
                                ": " + how_host_ended(h));
    }
    return verdict;
  }
  const HostEnd* reported = nullptr;
  const HostEnd* first_bad = nullptr;
  for (const auto& h : hosts) {
    if (h.reported_at >= 0 && (reported == nullptr || h.reported_at < reported->reported_at))
      reported = &h;
    if (h.code != 0 && (first_bad == nullptr || h.ended_at < first_bad->ended_at)) first_bad = &h;
  }
  if (reported != nullptr) {
    verdict.code = reported->code != 0 ? reported->code : 1;
    verdict.summary.push_back("job failed; the first failure was on host " + reported->host + ": " +
                              reported->report.front());
    verdict.summary.insert(verdict.summary.end(), reported->report.begin() + 1,
                           reported->report.end());
    return verdict;
  }
  if (first_bad == nullptr) return verdict;
  verdict.code = first_bad->code;
  verdict.summary.push_back("job failed: " + how_host_ended(*first_bad));
  return verdict;
}

}  // namespace ddp::launcher
