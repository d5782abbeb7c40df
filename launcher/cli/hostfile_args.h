#pragma once
// The command line of `ddprun --hostfile FILE ...` / `ddprun -H a:4,b:4 ...`:
// which flags are the front end's, which go to every host's agent as typed,
// and the agent command line each host runs. Pure (no file is read here).

#include <optional>
#include <string>
#include <vector>

#include "cli/hostfile.h"
#include "cli/hostfile_options.h"
#include "cli/launch_spec.h"

namespace ddp::launcher {

struct FrontEndArgs {
  HostfileText text;
  // The launcher flags every host's agent gets, as typed (abbreviations
  // expanded), without the front end's own and without those below.
  std::vector<std::string> forwarded;
  std::string rdzv_conf;  // as given ("" when not)
  std::string run_id;     // as given ("" when not)
  std::string nproc;      // --nproc_per_node as given ("" when not: each host's slots)
  std::string nnodes;     // --nnodes as given ("" when not: every host, a fixed number)
  double shutdown_timeout_s = 30;
  std::vector<std::string> program;  // the program and its arguments
};

// nullopt when `argv` (argv[0] first) gives neither --hostfile nor --hosts:
// a local job or one node's agent, for parse_launch_args. Throws ddp::Error
// (exit 2) for a front-end command line that cannot run: a flag the front
// end sets itself (--node_rank, --rdzv_endpoint, ...), a malformed --nnodes,
// both --hostfile and --hosts, --include without either, no program.
std::optional<FrontEndArgs> parse_front_end_args(const std::vector<std::string>& argv);

// What host `index` of `hosts` runs after its ddprun executable: the gate
// flag (--remote_agent=SECONDS, the longest it waits for the front end's
// go-ahead), its shape (--nnodes, --nproc_per_node from its slots unless
// given, c10d with the rendezvous on hosts[0]), the forwarded flags, "--",
// the program.
std::vector<std::string> agent_args(const FrontEndArgs& args, const std::vector<HostSlots>& hosts,
                                    size_t index, const std::string& run_id, double gate_timeout_s);

// The hosts the job needs, from --nnodes as given (`nnodes`, "" for all) and
// the `hosts` of `source` (the hostfile, or --hosts): N, or MIN:N, where N
// is the number of hosts (the job goes on while MIN of them remain). Throws
// ddp::Error naming --nnodes and the host count for any other range.
NodeRange hostfile_node_range(const std::string& nnodes, size_t hosts, const std::string& source);

// "user@host" -> "host" (what the other hosts connect to).
std::string host_address(const std::string& ssh_name);

// "a=1,is_host=0,b=2" -> "a=1,b=2" (the front end says which host hosts).
std::string without_is_host(const std::string& rdzv_conf);

}  // namespace ddp::launcher
