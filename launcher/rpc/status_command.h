#pragma once
// `ddprun status [ENDPOINT]`: asks a rendezvous server (the endpoint given,
// or those of this user's jobs on this machine, from the runtime directory)
// what every node last reported, and prints it as a table (--json: one JSON
// object per job per line; --watch: redrawn in place every --interval).
// Read-only: it calls only the Status RPC. Returns the exit code: 0, 1 when
// a job could not be asked (one line naming the endpoint and why), 2 for
// bad flags.

#include <string>
#include <vector>

namespace ddp::launcher {

int run_status_command(const std::vector<std::string>& argv);

}  // namespace ddp::launcher
