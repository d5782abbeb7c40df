#pragma once
// One record of the event log (--events_file): pure formatting, one JSON
// object per line. Field names follow torchelastic's events where they mean
// the same (name, source, timestamp, run_id, hostname, group_rank,
// global_rank, local_rank, pid, state, role); ddprun adds round, exit_code,
// signal, message. Unit-tested (tests/unit/launcher/observe/observability_test.cc).

#include <cstdint>
#include <optional>
#include <string>

namespace ddp::launcher {

struct EventRecord {
  std::string name;               // round_start, round_end, worker_start, worker_exit, failure,
                                  // restart, relaunch, hang, straggler
  std::string source = "AGENT";   // torchelastic's EventSource: AGENT or WORKER
  std::int64_t timestamp_ms = 0;  // wall clock, milliseconds since the epoch
  std::string run_id;
  std::string hostname;
  std::string role;
  std::int64_t round = 0;
  int group_rank = -1;  // the node's rank in the round (-1: before the round is known)
  std::optional<int> global_rank, local_rank, pid;
  std::string state;  // worker_exit: SUCCEEDED, FAILED; round_end: SUCCEEDED, FAILED, STOPPED;
                      // straggler: NAMED, RECOVERED
  std::optional<int> exit_code, signal;
  std::optional<int> restart_count;
  std::string message;  // a failure report, a restart's reason, a hang's first line, a
                        // straggler's evidence
};

// The record as one line of JSON (with the trailing newline). Absent
// optionals and empty strings are left out, except name, run_id and timestamp.
std::string format_event(const EventRecord& e);

}  // namespace ddp::launcher
