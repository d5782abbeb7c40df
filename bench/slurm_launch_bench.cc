// Launch under Slurm: a real two-node test cluster (tests/support/slurm_cluster.h,
// needs root and Debian's Slurm and MUNGE packages), 2 trivial Python workers
// per node, from srun's start to its exit:
//   bare      srun -N2 -n4 python3 trivial.py                  (Slurm alone)
//   ddprun    srun -N2 --ntasks-per-node=1 ddprun --nproc_per_node=2 ...
//   torchrun  srun -N2 --ntasks-per-node=1 env PYTHON_EXEC=/usr/bin/python3 torchrun
//             --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d
//             --rdzv-endpoint=n1:29400 ...  (the usual recipe)
// taking turns within each repetition. Prints medians, each launcher's
// overhead over bare srun, and its wall time over ddprun's. The torchrun is
// torchrun 2.x from $DDP_TORCH_ENV/bin/torchrun (scripts/install-torch-env.sh's
// environment, default /opt/ddprun-torch; its workers under the same
// /usr/bin/python3 as the others, PYTHON_EXEC), else Debian's torchrun 1.13
// (/usr/bin/torchrun).
// Usage: slurm_launch_bench DDPRUN [RUNS]

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <unistd.h>

#include "slurm_cluster.h"
#include "subprocess.h"

using namespace std::chrono_literals;
using ddp::testing::ProcessResult;
using ddp::testing::SlurmCluster;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string cpu_model() {
  const std::string info = ddp::testing::read_file("/proc/cpuinfo");
  auto at = info.find("model name");
  if (at == std::string::npos) return "unknown";
  auto colon = info.find(':', at);
  return info.substr(colon + 2, info.find('\n', colon) - colon - 2);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: slurm_launch_bench DDPRUN [RUNS]\n");
    return 64;
  }
  const std::string ddprun = argv[1];
  const int runs = argc > 2 ? std::max(1, std::atoi(argv[2])) : 7;
  if (std::string why = SlurmCluster::unavailable(); !why.empty()) {
    std::printf("skipped: %s\n", why.c_str());
    return 0;
  }
  SlurmCluster cluster(2);
  const std::string trivial = cluster.dir() + "/trivial.py";
  ddp::testing::write_file(
      trivial, "import os\nassert 'RANK' in os.environ or 'SLURM_PROCID' in os.environ\n");
  const std::string python = "/usr/bin/python3";
  struct Launcher {
    std::string name;
    std::vector<std::string> argv;
    std::vector<double> seconds;
  };
  std::vector<Launcher> launchers = {
      {"bare srun -n4", {"srun", "-N2", "-n4", python, trivial}, {}},
      {"ddprun",
       {"srun", "-N2", "--ntasks-per-node=1", ddprun, "--nproc_per_node=2", python, trivial},
       {}},
  };
  const char* torch_env = std::getenv("DDP_TORCH_ENV");
  const std::string torchrun2 =
      std::string(torch_env && *torch_env ? torch_env : "/opt/ddprun-torch") + "/bin/torchrun";
  if (::access(torchrun2.c_str(), X_OK) == 0) {
    launchers.push_back(
        {"torchrun 2.x (c10d)",
         {"srun", "-N2", "--ntasks-per-node=1", "env", "PYTHON_EXEC=" + python, torchrun2,
          "--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=n1:29400",
          "--rdzv-id=bench", "--monitor-interval", "0.1", trivial},
         {}});
  } else if (::access("/usr/bin/torchrun", X_OK) == 0) {
    launchers.push_back({"torchrun 1.13 (c10d)",
                         {"srun", "-N2", "--ntasks-per-node=1", "/usr/bin/torchrun", "--nnodes=2",
                          "--nproc_per_node=2", "--rdzv_backend=c10d", "--rdzv_endpoint=n1:29400",
                          "--rdzv_id=bench", "--redirects", "9:1", "--tee", "9:1",
                          "--monitor_interval", "0.1", trivial},
                         {}});
  }
  for (int r = 0; r < runs + 1; ++r) {  // the first round warms caches and is not counted
    for (auto& l : launchers) {
      ProcessResult p = ddp::testing::run_process(cluster.on_login(l.argv), {}, 120s);
      if (!p.exited || p.code != 0) {
        std::fprintf(stderr, "%s failed (exit %d):\n%s%s\n", l.name.c_str(), p.code, p.out.c_str(),
                     p.err.c_str());
        return 1;
      }
      if (r > 0) l.seconds.push_back(p.seconds);
    }
  }
  std::printf(
      "CPU: %s; Slurm test cluster of 2 nodes (network namespaces), 2 trivial Python workers per "
      "node\n",
      cpu_model().c_str());
  std::printf("median of %d runs, srun start to exit:\n", runs);
  std::printf("%-22s %12s %22s %10s\n", "launcher", "wall_ms", "overhead_vs_bare_ms", "vs_ddprun");
  const double bare = median(launchers[0].seconds) * 1e3;
  const double ddp = median(launchers[1].seconds) * 1e3;
  for (auto& l : launchers) {
    const double ms = median(l.seconds) * 1e3;
    std::printf("%-22s %12.1f %22.1f %9.1fx\n", l.name.c_str(), ms, ms - bare, ms / ddp);
  }
  return 0;
}
