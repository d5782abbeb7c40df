#pragma once
// ddprun's subcommands besides launching: `ddprun rendezvous` (the standalone
// rendezvous daemon) and `ddprun health HOST:PORT` (a gRPC health probe).
// Each returns the process exit code; bad flags print one error line and return 2.

#include <string>
#include <vector>

namespace ddp::launcher {

struct RdzvConf;
struct RendezvousConfig;
// Copies --rdzv_conf's store limits into a server config.
void apply_limits(const RdzvConf& conf, RendezvousConfig& config);

// argv[0] is "ddprun", argv[1] the subcommand name.
int run_rendezvous_command(const std::vector<std::string>& argv, int signal_fd);
int run_health_command(const std::vector<std::string>& argv);

}  // namespace ddp::launcher
