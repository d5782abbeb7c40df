#pragma once
// The agent's side of a `ddprun --hostfile` job (ddprun --remote_agent=S ...,
// started by the front end over ssh). Before the agent starts, open() moves
// the ssh channel (stdin) aside (the workers get /dev/null), reserves the
// rendezvous port on the first host, says "ddprun-ready" and waits at most S
// seconds for the front end's "go" (the rendezvous endpoint and the job's
// token, which never appear on a command line). After the agent's orphan
// guard exists, watch() starts a thread that turns the front end's "signal SIG"
// into SIG for this ddprun (a stop, or SIGUSR1/2 for the workers), and the
// channel's end (the front end died) or its silence for kFrontEndSilence (the
// front end's network cut, or the front end stopped) into SIGTERM at once and
// a second SIGTERM 0.5 s later: the agent then kills its own workers' process
// groups without waiting out the shutdown grace (and, under --on_failure=heal
// with room for fewer nodes, leaves the round without ending it:
// Agent::on_front_end_lost). Nothing is matched by name: each agent stops
// exactly the workers it started.

#include <optional>

#include "agent/port_reservation.h"
#include "cli/launch_spec.h"

namespace ddp::launcher {

class RemoteGate {
 public:
  // Returns 0 to go on with `spec` updated, else the exit code (the front end
  // left, a signal, or no go-ahead within `timeout_s`).
  int open(LaunchSpec& spec, double timeout_s, int signal_fd);
  void watch();
  // Whether watch() stopped this ddprun because the channel ended or fell
  // silent (not for a signal the front end passed on). Thread-safe.
  static bool front_end_lost();

 private:
  int control_fd_ = -1;
  std::optional<PortReservation> port_;  // held until the rendezvous listens on it
};

}  // namespace ddp::launcher
