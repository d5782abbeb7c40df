#pragma once
// The flags of `ddprun --hostfile` / `--hosts` (the front end that starts one
// agent per host over ssh), declared with the launcher's other flags so that
// --help and abbreviations know them. Only the front end reads them.

#include <string>
#include <vector>

// CLI11 itself only where options are declared or parsed: its header adds
// seconds to the compile of every file that includes it.
namespace CLI {
class App;
}  // namespace CLI

namespace ddp::launcher {

struct HostfileText {
  std::string hostfile, hosts, include, exclude, ssh_opts;
  int ssh_port = 0;
  double ssh_timeout_s = 10;
  std::vector<std::string> env;  // --env NAME[=VALUE], repeatable
};

void declare_hostfile_options(CLI::App& app, HostfileText& text);

// The long names of those flags ("--hostfile", ...), and of the launcher
// flags the front end sets itself for every host and so refuses.
const std::vector<std::string>& hostfile_flag_names();
const std::vector<std::string>& flags_set_by_front_end();

}  // namespace ddp::launcher
