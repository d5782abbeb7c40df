#pragma once
// What `ddprun status` shows, as plain data: each rank's state as its agent
// sees it, each node's, the job's. Pure logic (no I/O): deciding a rank's
// state from what the agent observed, and rendering a job as a table or as
// JSON. Agents fill NodeStatus (observe/status_probe), the rpc plugin carries
// it to the rendezvous server and back (rpc/status_proto), the status
// command renders it. Unit-tested (tests/unit/launcher/observe/observability_test.cc).

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::launcher {

enum class RankState { kStarting, kRunning, kInCollective, kStopped, kExited };
const char* rank_state_name(RankState s);          // "starting", "running", ...
RankState rank_state_of(const std::string& name);  // kRunning for an unknown name

struct RankStatus {
  int rank = 0;
  int local_rank = 0;
  int pid = -1;
  RankState state = RankState::kStarting;
  std::string collective_op;  // kInCollective: "all_reduce", ...
  std::uint64_t collective_seq = 0;
  double in_collective_s = 0;
  int exit_code = 0;              // kExited
  int exit_signal = 0;            // kExited by a signal
  double last_output_age_s = -1;  // -1: nothing written yet
  double cpu_percent = 0;
  std::uint64_t rss_bytes = 0;
  std::uint64_t collectives_done = 0;
  double collective_wait_s = 0;
  int incarnation = 0;
  bool libddp = false;
  // libddp ranks: the share of wall time the others waited for this rank
  // (observe/straggler_detector.h; 0 until enough intervals), and whether it
  // is named a straggler.
  double straggler_score = 0;
  bool straggler = false;
  // libddp ranks: training steps finished (synchronising GradSync or
  // SharedGradSum finish calls), and the time from one step's end to the
  // next's: median and 99th percentile of the last 128 steps (0 until two
  // steps ended).
  std::uint64_t steps = 0;
  double step_median_s = 0;
  double step_p99_s = 0;
};

struct NodeStatus {
  int node_rank = 0;
  std::string host;
  std::int64_t round = 0;
  int restarts = 0;
  int relaunches = 0;
  double age_s = 0;
  std::string run_id;
  int world_size = 0;
  double heartbeat_age_s = -1;  // -1: unknown (the node's own view)
  // Judged at the rendezvous across nodes (observe/node_straggler_detector.h):
  // the share of time the other nodes waited for this one, and whether it
  // is named a straggler; 0 and false in a node's own view.
  double straggler_score = 0;
  bool straggler = false;
  std::vector<RankStatus> ranks;
};

struct JobStatus {
  std::string run_id;
  std::string endpoint;  // where it was asked
  std::int64_t round = 0;
  double age_s = 0;
  int restarts = 0;
  std::vector<NodeStatus> nodes;
  int world_size() const;
};

// What the agent saw of one rank at one moment, from which its state follows.
struct RankObservation {
  bool running = false;
  bool stopped = false;      // SIGSTOPped (the leader is in state T)
  bool exited = false;       // reaped
  double since_start_s = 0;  // since the process was started
  bool attached = false;     // libddp writes its progress slot
  std::uint64_t begun = 0, completed = 0;
};
// kStarting: running, not yet on the board and < kStartingWindow since
// start, without output. An unattached rank that wrote output is running.
RankState classify_rank(const RankObservation& o, bool wrote_output);
inline constexpr double kStartingWindowS = 5.0;

// "1.2 s", "3 m 04 s", "2 h 01 m"; "-" for a negative age.
std::string format_age(double seconds);
// A step's time: "850 us", "45.3 ms", else as format_age ("1.2 s").
std::string format_duration(double seconds);
// "512 KiB", "1.5 GiB".
std::string format_bytes(std::uint64_t bytes);
// The state column: "running", "in all_reduce #57 for 3.0 s", "exited 1",
// "exited SIGKILL", "stopped".
std::string state_text(const RankStatus& r);

// The whole job, one table (ends with a newline).
std::string format_status_table(const JobStatus& job);
// The job as one JSON object (ends with a newline).
std::string status_json(const JobStatus& job);

// A job of the runtime directory that ddprun status could not ask.
struct UnansweredJob {
  long pid = 0;  // its ddprun
  std::string run_id, endpoint;
  std::string reason;  // one line: why it did not answer
};

// Why asking a registered job failed, as the Status call ended.
enum class AskFailure {
  kNoAnswer,        // nothing answered at its endpoint (UNAVAILABLE, DEADLINE_EXCEEDED)
  kNotARendezvous,  // a gRPC server without ddprun's Status (UNIMPLEMENTED)
  kAnotherJob,      // a rendezvous of another run (INVALID_ARGUMENT)
  kRefusedToken,    // UNAUTHENTICATED
  kOther,
};

// Where the job's ddprun is in the network, against this process: both
// network namespaces as /proc names them ("net:[4026531840]"), "" when not
// readable.
struct NetworkPlace {
  std::string job_ns, own_ns;
  bool elsewhere() const { return !job_ns.empty() && !own_ns.empty() && job_ns != own_ns; }
};

// The one-line reason for an UnansweredJob: what answered (or not) at its
// endpoint, `detail` being gRPC's message, and, when its ddprun runs in
// another network namespace (a container, `ip netns`), that its endpoint is
// that namespace's and how to ask from there.
std::string unanswered_reason(AskFailure failure, const std::string& detail, long pid,
                              const std::string& endpoint, const NetworkPlace& place);

// "ddprun pid 4242, run 'job1', rendezvous 127.0.0.1:29400: not answered: ..." (with a newline).
std::string format_unanswered(const UnansweredJob& job);
// {"pid":4242,"run_id":"job1","endpoint":"127.0.0.1:29400","answered":false,"error":"..."}
std::string unanswered_json(const UnansweredJob& job);

// JSON string quoting (shared with the event log).
std::string json_quote(const std::string& s);

}  // namespace ddp::launcher
