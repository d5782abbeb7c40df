#pragma once
// A real Slurm cluster (Debian's slurmctld/slurmd 22.05 and munged) for
// integration tests: node i is `n<i+1>`, a test host of its own (NetnsHosts:
// a network namespace with address 198.18.0.<i+1>) running `slurmd -N n<i+1>`
// in a UTS namespace whose hostname is its node name; host 0 also runs
// slurmctld and munged and is the login node the tests submit from.
//
// Everything the cluster writes (slurm.conf, cgroup.conf, state and spool
// directories, logs, the munge key and socket) lies in one fresh directory,
// <TMPDIR or /tmp>/ddpslurm-<test pid>-XXXXXX: nothing is written under /etc,
// and a system Slurm or MUNGE, if any, is neither used nor disturbed. Every
// daemon and client command gets SLURM_CONF=<dir>/slurm.conf.
//
// The destructor cancels every job, stops the daemons (SIGTERM, then SIGKILL),
// kills whatever is left in the namespaces, removes them and the directory,
// also when a test fails. Daemons, steps and tasks left by a test binary that
// was killed (their owner's pid is gone) are killed by the next constructor.
// Needs root.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "netns_hosts.h"
#include "subprocess.h"

namespace ddp::testing {

class SlurmCluster {
 public:
  // Why a cluster cannot be brought up here (not root, no network namespaces,
  // a Slurm or MUNGE program missing), or "".
  static std::string unavailable();

  // Brings the cluster up and waits (bounded) until every node is idle;
  // throws std::runtime_error with the daemons' log tails otherwise.
  explicit SlurmCluster(int nodes = 2, int cpus_per_node = 4);
  ~SlurmCluster();
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  int size() const { return nodes_; }
  std::string node_name(int i) const;     // "n<i+1>"
  std::string node_address(int i) const;  // "198.18.0.<i+1>"
  // The cluster's directory: put job scripts and outputs here.
  std::string dir() const { return dir_; }
  std::string conf() const { return dir_ + "/slurm.conf"; }
  // What on_login/on_node put in a command's environment, as Subprocess's env
  // argument, for a client command run some other way (e.g. hosts().on()):
  // SLURM_CONF, and "\x01" (removed) for the test's own SLURM_* variables.
  std::map<std::string, std::string> env() const;

  // argv that runs a client command (srun, sbatch, squeue, scancel, sinfo...)
  // on the login node, which is node n1 (host 0's network namespace, hostname
  // n1), with SLURM_CONF set and the test's own SLURM_*/SBATCH_*/SALLOC_*/SRUN_*
  // variables removed (a test run inside a Slurm job must not leak its job
  // into the test cluster). Run it with Subprocess/run_process.
  std::vector<std::string> on_login(const std::vector<std::string>& argv) const;
  // The same on node i (its host's network namespace, hostname n<i+1>).
  std::vector<std::string> on_node(int i, const std::vector<std::string>& argv) const;
  const NetnsHosts& hosts() const { return *hosts_; }

  // Tails of the daemons' logs, for failure messages.
  std::string logs(int lines = 40) const;
  double bring_up_seconds() const { return bring_up_seconds_; }

 private:
  void bring_up(int cpus_per_node);
  void write_config(int cpus_per_node) const;
  void wait_until_idle();
  void shutdown();
  std::vector<std::string> as_node(int i, const std::vector<std::string>& argv) const;

  int nodes_;
  std::string unshare_;
  std::string dir_;
  std::unique_ptr<NetnsHosts> hosts_;
  std::unique_ptr<Subprocess> munged_;
  std::unique_ptr<Subprocess> slurmctld_;
  std::vector<std::unique_ptr<Subprocess>> slurmds_;
  double bring_up_seconds_ = 0;
};

}  // namespace ddp::testing
