#pragma once
// The hosts of a `ddprun --hostfile` job: DeepSpeed's hostfile (`HOST slots=N`
// lines, `#` comments), Open MPI's spellings (`HOST slots=N max_slots=M`,
// `HOST:N`, a bare `HOST` for one slot), Horovod's and mpirun's `-H a:4,b:4`,
// and DeepSpeed's --include/--exclude (`a@b:0,2`). Pure: parsing only; every
// error is a ddp::Error of one line naming the file and line, or the flag.

#include <string>
#include <vector>

namespace ddp::launcher {

struct HostSlots {
  std::string name;  // as ssh takes it: HOST or USER@HOST
  int slots = 1;
  // The slot (device) indices this job uses on the host, ascending; empty:
  // all of them, and the workers' CUDA_VISIBLE_DEVICES is left alone.
  std::vector<int> devices;
  int line = 0;  // in the hostfile (0 for --hosts)

  int workers() const { return devices.empty() ? slots : static_cast<int>(devices.size()); }
};

// `text` read from `source` (the path, for errors: "hosts:3: ...").
std::vector<HostSlots> parse_hostfile(const std::string& text, const std::string& source);

// --hosts / -H: "a:4,b:4" (a host without ":N" has one slot).
std::vector<HostSlots> parse_host_list(const std::string& text);

// DeepSpeed's --include/--exclude (at most one of them non-empty): hosts
// separated by '@', each optionally with ":i,j" slot indices. Include keeps
// only the named hosts (the named slots, else all); exclude drops named hosts,
// or only the named slots of a host. A host left with no slot is dropped.
// `source` names where the hosts came from, for errors.
std::vector<HostSlots> select_hosts(std::vector<HostSlots> hosts, const std::string& include,
                                    const std::string& exclude, const std::string& source);

}  // namespace ddp::launcher
