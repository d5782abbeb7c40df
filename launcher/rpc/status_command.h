#pragma once
// `ddprun status [ENDPOINT]`: asks a rendezvous server (the endpoint given,
// or those of this user's jobs on this machine, from the runtime directory)
// what every node last reported, and prints it as a table (--json: one JSON
// object per job per line; --watch: redrawn in place every --interval).
// Read-only: it calls only the Status RPC. A job of the runtime directory
// that does not answer gets one line (one object) naming its ddprun's pid,
// run id, endpoint and the reason, and the others are shown. Returns the
// exit code: 0 when some job answered, 1 when none did (the endpoint given
// could not be asked: one line naming it and why) or none runs here, 2 for
// bad flags.

#include <string>
#include <vector>

namespace ddp::launcher {

int run_status_command(const std::vector<std::string>& argv);

}  // namespace ddp::launcher
