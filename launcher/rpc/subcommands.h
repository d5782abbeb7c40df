#pragma once
// ddprun's subcommands besides launching: `ddprun rendezvous` (the standalone
// rendezvous daemon) and `ddprun health HOST:PORT` (a gRPC health probe).
// Each returns the process exit code; bad flags print one error line and return 2.

#include <chrono>
#include <string>
#include <vector>

namespace ddp::launcher {

struct RdzvConf;
struct RendezvousConfig;
// The one builder of a rendezvous server's config, for the standalone server
// and the hosting agent alike: --rdzv_conf's timeouts and store limits.
RendezvousConfig rendezvous_config(const std::string& run_id, const std::string& token,
                                   int min_nodes, int max_nodes, int max_restarts,
                                   const RdzvConf& conf);
// How long a server keeps answering once the job's outcome is known:
// close_timeout, else two heartbeat intervals and half a second.
std::chrono::milliseconds close_time(const RdzvConf& conf);

// argv[0] is "ddprun", argv[1] the subcommand name.
int run_rendezvous_command(const std::vector<std::string>& argv, int signal_fd);
int run_health_command(const std::vector<std::string>& argv);

}  // namespace ddp::launcher
