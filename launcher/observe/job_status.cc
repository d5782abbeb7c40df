#include "observe/job_status.h"

#include <signal.h>
#include <string.h>

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

namespace ddp::launcher {

const char* rank_state_name(RankState s) {
  switch (s) {
    case RankState::kStarting:
      return "starting";
    case RankState::kRunning:
      return "running";
    case RankState::kInCollective:
      return "in_collective";
    case RankState::kStopped:
      return "stopped";
    case RankState::kExited:
      return "exited";
  }
  return "running";
}

RankState rank_state_of(const std::string& name) {
  for (RankState s : {RankState::kStarting, RankState::kRunning, RankState::kInCollective,
                      RankState::kStopped, RankState::kExited}) {
    if (name == rank_state_name(s)) return s;
  }
  return RankState::kRunning;
}

int JobStatus::world_size() const {
  int n = 0;
  for (const auto& node : nodes) n += static_cast<int>(node.ranks.size());
  return n;
}

RankState classify_rank(const RankObservation& o, bool wrote_output) {
  if (o.exited || !o.running) return RankState::kExited;
  if (o.stopped) return RankState::kStopped;
  if (o.attached && o.begun > o.completed) return RankState::kInCollective;
  if (!o.attached && !wrote_output && o.since_start_s < kStartingWindowS) {
    return RankState::kStarting;
  }
  return RankState::kRunning;
}

std::string format_age(double s) {
  if (s < 0) return "-";
  if (s < 60) return fmt::format("{:.1f} s", s);
  const auto whole = static_cast<long long>(s);
  if (whole < 3600) return fmt::format("{} m {:02} s", whole / 60, whole % 60);
  return fmt::format("{} h {:02} m", whole / 3600, (whole % 3600) / 60);
}

std::string format_duration(double s) {
  if (s < 1e-3) return fmt::format("{:.0f} us", s * 1e6);
  if (s < 1) return fmt::format("{:.1f} ms", s * 1e3);
  return format_age(s);
}

std::string format_bytes(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  if (u == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.1f} {}", v, units[u]);
}

std::string state_text(const RankStatus& r) {
  switch (r.state) {
    case RankState::kInCollective:
      return fmt::format("in {} #{} for {}",
                         r.collective_op.empty() ? "collective" : r.collective_op, r.collective_seq,
                         format_age(r.in_collective_s));
    case RankState::kExited: {
      if (r.exit_signal > 0) {
        const char* abbrev = sigabbrev_np(r.exit_signal);
        return abbrev ? fmt::format("exited SIG{}", abbrev)
                      : fmt::format("exited signal {}", r.exit_signal);
      }
      return fmt::format("exited {}", r.exit_code);
    }
    default:
      return rank_state_name(r.state);
  }
}

namespace {

// Pads every column of `rows` to its widest cell; the first row is the header.
std::string render_columns(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()));
    for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(width[c] - row[c].size() + 2, ' ');
    }
    out += "  " + line + "\n";
  }
  return out;
}

std::string rank_collectives(const RankStatus& r) {
  if (!r.libddp) return "-";
  return fmt::format("{} ({} wait)", r.collectives_done, format_age(r.collective_wait_s));
}

// "120 (45ms, p99 60ms)": steps, and their median and 99th percentile time.
std::string rank_steps(const RankStatus& r) {
  if (!r.libddp || r.steps == 0) return "-";
  if (r.step_median_s <= 0) return std::to_string(r.steps);
  return fmt::format("{} ({}, p99 {})", r.steps, format_duration(r.step_median_s),
                     format_duration(r.step_p99_s));
}

// A straggler score as a percentage, "STRAGGLER" after it once named.
std::string straggler_text(double score, bool named) {
  const std::string percent = fmt::format("{:.0f}%", 100.0 * score);
  return named ? percent + " STRAGGLER" : percent;
}

// The share of time the others waited for the rank.
std::string rank_straggler(const RankStatus& r) {
  return r.libddp ? straggler_text(r.straggler_score, r.straggler) : "-";
}

// The share of time the other nodes waited for the node ("0%" too until the
// rendezvous has judged enough intervals); "-" for a job of one node.
std::string node_straggler(const JobStatus& job, const NodeStatus& n) {
  return job.nodes.size() < 2 ? "-" : straggler_text(n.straggler_score, n.straggler);
}

}  // namespace

std::string format_status_table(const JobStatus& job) {
  std::string out =
      fmt::format("run {}  round {}  age {}  restarts {}  world size {}  ({})\n",
                  job.run_id.empty() ? "?" : job.run_id, job.round, format_age(job.age_s),
                  job.restarts, job.world_size(), job.endpoint);
  std::vector<std::vector<std::string>> nodes{
      {"NODE", "HOST", "HEARTBEAT", "RESTARTS", "RELAUNCHES", "RANKS", "WAITED-FOR"}};
  for (const auto& n : job.nodes) {
    nodes.push_back({std::to_string(n.node_rank), n.host, format_age(n.heartbeat_age_s),
                     std::to_string(n.restarts), std::to_string(n.relaunches),
                     std::to_string(n.ranks.size()), node_straggler(job, n)});
  }
  out += render_columns(nodes);
  std::vector<std::vector<std::string>> ranks{{"RANK", "NODE", "PID", "STATE", "OUTPUT", "CPU%",
                                               "RSS", "STEPS", "COLLECTIVES", "WAITED-FOR"}};
  for (const auto& n : job.nodes) {
    for (const auto& r : n.ranks) {
      ranks.push_back({std::to_string(r.rank), std::to_string(n.node_rank), std::to_string(r.pid),
                       state_text(r), format_age(r.last_output_age_s),
                       fmt::format("{:.0f}", r.cpu_percent), format_bytes(r.rss_bytes),
                       rank_steps(r), rank_collectives(r), rank_straggler(r)});
    }
  }
  out += "\n" + render_columns(ranks);
  return out;
}

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

namespace {

std::string rank_json(const RankStatus& r) {
  return fmt::format(
      "{{\"rank\":{},\"local_rank\":{},\"pid\":{},\"state\":\"{}\",\"state_text\":{},"
      "\"collective_op\":{},\"collective_seq\":{},\"in_collective_s\":{:.3f},\"exit_code\":{},"
      "\"exit_signal\":{},\"last_output_age_s\":{:.3f},\"cpu_percent\":{:.1f},\"rss_bytes\":{},"
      "\"libddp\":{},\"collectives_done\":{},\"collective_wait_s\":{:.3f},\"incarnation\":{},"
      "\"straggler_score\":{:.3f},\"straggler\":{},\"steps\":{},\"step_median_s\":{:.6f},"
      "\"step_p99_s\":{:.6f}}}",
      r.rank, r.local_rank, r.pid, rank_state_name(r.state), json_quote(state_text(r)),
      json_quote(r.collective_op), r.collective_seq, r.in_collective_s, r.exit_code, r.exit_signal,
      r.last_output_age_s, r.cpu_percent, r.rss_bytes, r.libddp ? "true" : "false",
      r.collectives_done, r.collective_wait_s, r.incarnation, r.straggler_score,
      r.straggler ? "true" : "false", r.steps, r.step_median_s, r.step_p99_s);
}

}  // namespace

std::string status_json(const JobStatus& job) {
  std::string out = fmt::format(
      "{{\"run_id\":{},\"endpoint\":{},\"round\":{},\"age_s\":{:.3f},\"restarts\":{},"
      "\"world_size\":{},\"nodes\":[",
      json_quote(job.run_id), json_quote(job.endpoint), job.round, job.age_s, job.restarts,
      job.world_size());
  for (std::size_t i = 0; i < job.nodes.size(); ++i) {
    const auto& n = job.nodes[i];
    out += fmt::format(
        "{}{{\"node_rank\":{},\"host\":{},\"round\":{},\"heartbeat_age_s\":{:.3f},\"restarts\":{},"
        "\"relaunches\":{},\"age_s\":{:.3f},\"straggler_score\":{:.3f},\"straggler\":{},"
        "\"ranks\":[",
        i ? "," : "", n.node_rank, json_quote(n.host), n.round, n.heartbeat_age_s, n.restarts,
        n.relaunches, n.age_s, n.straggler_score, n.straggler ? "true" : "false");
    for (std::size_t k = 0; k < n.ranks.size(); ++k) {
      out += (k ? "," : "") + rank_json(n.ranks[k]);
    }
    out += "]}";
  }
  return out + "]}\n";
}

namespace {

// What answered at the endpoint instead of the job's rendezvous.
std::string what_answered(AskFailure failure, const std::string& detail,
                          const std::string& endpoint) {
  switch (failure) {
    case AskFailure::kNoAnswer:
      return "nothing answers at " + endpoint + " from here (" + detail + ")";
    case AskFailure::kNotARendezvous:
      return "a gRPC server that is not its rendezvous answers at " + endpoint + " from here";
    case AskFailure::kAnotherJob:
      return "another job's rendezvous answers at " + endpoint + " from here (" + detail + ")";
    case AskFailure::kRefusedToken:
      return "its rendezvous at " + endpoint + " refused the token (" + detail +
             "; give it with DDP_RDZV_TOKEN, --rdzv_token or --rdzv_token_file)";
    case AskFailure::kOther:
      break;
  }
  return endpoint + " did not answer as a ddprun rendezvous (" + detail + ")";
}

}  // namespace

std::string unanswered_reason(AskFailure failure, const std::string& detail, long pid,
                              const std::string& endpoint, const NetworkPlace& place) {
  std::string reason = what_answered(failure, detail, endpoint);
  if (failure == AskFailure::kRefusedToken) return reason;
  if (place.elsewhere()) {
    return reason + ": its ddprun runs in another network namespace (" + place.job_ns +
           ", this one is " + place.own_ns +
           ": a container or `ip netns`), where that address is its own; ask from there: "
           "nsenter --net=/proc/" +
           std::to_string(pid) + "/ns/net ddprun status";
  }
  if (failure == AskFailure::kNoAnswer) {
    return reason +
           ": its rendezvous is down (the job is ending, or the node that hosts it is "
           "gone) or cannot be reached from this machine";
  }
  return reason + ": its endpoint reaches another server from here";
}

std::string format_unanswered(const UnansweredJob& job) {
  return fmt::format("ddprun pid {}, run '{}', rendezvous {}: not answered: {}\n", job.pid,
                     job.run_id, job.endpoint, job.reason);
}

std::string unanswered_json(const UnansweredJob& job) {
  return fmt::format(
      "{{\"pid\":{},\"run_id\":{},\"endpoint\":{},\"answered\":false,\"error\":{}}}\n", job.pid,
      json_quote(job.run_id), json_quote(job.endpoint), json_quote(job.reason));
}

}  // namespace ddp::launcher
