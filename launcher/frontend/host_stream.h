#pragma once
// Pure pieces of the `ddprun --hostfile` front end and its remote agents:
// the lines of the small protocol on each ssh channel (the agent's
// "ddprun-ready", the front end's "go" and "stop"), splitting a host's output
// into whole lines, labelling an agent's own lines with its host, catching a
// host's failure report, and the front end's exit code and summary.

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ddp::launcher {

// Agent -> front end, on its stdout once its command line is parsed: ready to
// start (host 0 with the rendezvous port it reserved).
std::string ready_line(int port);
std::optional<int> parse_ready(const std::string& line);  // the port (0: none)
// Front end -> agent, on its stdin: the rendezvous and the job's token.
std::string go_line(const std::string& endpoint, const std::string& token);
std::optional<std::pair<std::string, std::string>> parse_go(const std::string& line);
// Front end -> agent: act as if `sig` arrived: SIGINT, SIGTERM, SIGHUP, SIGQUIT
// stop the agent's workers; SIGUSR1, SIGUSR2 are forwarded to them (notices).
std::string signal_line(int sig);
std::optional<int> parse_signal(const std::string& line);
// Front end -> agent, every kAliveInterval after "go": the front end is there.
// An agent that hears nothing for kFrontEndSilence (the front end's network
// cut, or the front end stopped) stops its workers as when the channel closes.
inline constexpr std::chrono::milliseconds kAliveInterval{250};
inline constexpr std::chrono::milliseconds kFrontEndSilence{1250};
std::string alive_line();

// Bytes in, whole lines out (without '\n'); what is left at EOF with finish().
class LineBuffer {
 public:
  std::vector<std::string> add(const char* data, size_t size);
  std::optional<std::string> finish();

 private:
  std::string partial_;
};

// "[ddprun] text" from `host` -> "[ddprun host] text"; worker lines ("[rank N] ...")
// and a report's continuation lines are unchanged.
std::string label_line(const std::string& line, const std::string& host);

// A host's failure report on its stderr: the agent's "worker failed: ..." or
// "worker group hung ..." line and the indented lines after it.
class ReportCatcher {
 public:
  // Returns true when `line` starts the host's first report.
  bool add(const std::string& line);
  const std::vector<std::string>& report() const { return report_; }

 private:
  std::vector<std::string> report_;
  bool open_ = false;
};

struct HostEnd {
  std::string host;
  int code = 0;           // the agent's exit code as ssh returns it (255: ssh itself failed)
  long ended_at = -1;     // order in which the hosts ended (-1: still running)
  long reported_at = -1;  // order in which failure reports arrived (-1: none)
  std::vector<std::string> report;
};

struct Verdict {
  int code = 0;
  // Lines for the front end's log: why the job failed, or, for a job that
  // finished without some of its hosts, which hosts it lost.
  std::vector<std::string> summary;
};

// How host `end` ended, for a line: "the ssh connection to host b failed or
// was lost (ssh exit code 255)", "the agent on host b ended with exit code 1".
std::string how_host_ended(const HostEnd& end);

// Whether the job can still finish: at least `min_hosts` hosts run or ended 0
// (a host that ended non-zero is lost to the job; --nnodes=MIN:N lets the
// rendezvous go on without it).
bool job_can_go_on(const std::vector<HostEnd>& hosts, size_t min_hosts);

// The job's exit code: 128 + `signal` when the front end was stopped; else 0
// when every host ended 0, or when at least `min_hosts` of them did and the
// others were lost on the way (the summary names each, for a warning); else
// the code of the host whose failure report came first (its host, rank and
// stderr tail in the summary); else the first host that ended non-zero.
// `min_hosts` 0 means every host.
Verdict decide(const std::vector<HostEnd>& hosts, int signal, size_t min_hosts = 0);

}  // namespace ddp::launcher
