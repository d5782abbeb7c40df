#pragma once
// The command line of a `ddprun SUBCOMMAND ...` (argv[2...]) through CLI11.

#include <functional>
#include <string>
#include <vector>

// CLI11 itself only where options are declared or parsed: its header adds
// seconds to the compile of every file that includes it.
namespace CLI {
class App;
}  // namespace CLI

namespace ddp::launcher {

// Returns -1 to go on, else the exit code: 0 after printing the help to
// stdout, 2 after a usage error, handed to `report` (CLI11's message).
int parse_subcommand_args(CLI::App& app, const std::vector<std::string>& argv,
                          const std::function<void(const std::string&)>& report);

}  // namespace ddp::launcher
