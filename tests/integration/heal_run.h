#pragma once
// What the live-recovery tests share: ddprun --on_failure=heal running the
// reference trainer with faults to inject (heal_fault_worker), and the
// checks every run ends with: exit 0, every rank holding the same weights
// (equal checksums), the asked-for number of committed steps, and every
// sample of every epoch in exactly one committed step (the --sample_log
// ledger every process writes).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "subprocess.h"

namespace ddp::testing {

extern const std::string kDdprun;
extern const std::string kWorker;  // heal_fault_worker
// 514 samples: with 4 ranks of 32 the last step of each epoch has 2 samples
// for 4 slices, so some ranks contribute an empty slice.
constexpr std::int64_t kDataset = 514;
// The workers' environment: a 30 s group timeout, debug logs.
extern const std::map<std::string, std::string> kEnv;

struct HealRun {
  ProcessResult result;
  std::string dir;  // where the sample logs are
};

// The trainer's flags: `steps` steps of a small MLP on kDataset samples,
// each process's ledger under DIR/slog.
std::vector<std::string> train_args(const std::string& dir, std::int64_t steps);
// The same with --shard_optimizer and Adam (two state buffers and a step
// count: a lost or stale shard changes the weights).
std::vector<std::string> sharded_args(const std::string& dir, std::int64_t steps);
// `args` with a checkpoint every 50 steps in DIR/ckpt, resumed from on a restart.
std::vector<std::string> with_checkpoints(const std::string& dir, std::vector<std::string> args);
// ddprun --nproc_per_node=NPROC --on_failure=heal --max_restarts=4 LAUNCHER...
// heal_fault_worker FAULTS... TRAIN...
std::vector<std::string> heal_argv(int nproc, const std::vector<std::string>& launcher,
                                   const std::vector<std::string>& faults,
                                   const std::vector<std::string>& train);
// Each node's ddprun of one run (hosts, or nodes of one machine), waited for
// (`timeout` each): their output together, ended (exited) when all ended,
// with the first non-zero exit code among them (0 when all ended 0).
HealRun gather(std::vector<std::unique_ptr<Subprocess>>& nodes, const std::string& dir,
               std::chrono::milliseconds timeout);
// One run on this machine, waited for (2 minutes at most).
HealRun run_heal(int nproc, const std::vector<std::string>& faults, std::int64_t steps,
                 const std::vector<std::string>& launcher = {});

// The ledger: every process's committed steps. "" when steps 0..steps-1
// each appear with one (epoch, offset, count), and in order they tile every
// epoch exactly; else the first problem. The last step of a process that
// died before the end may differ (a host lost mid-step: its ranks can finish
// a step on their own that the survivors redo).
std::string ledger_problem(const std::string& dir, std::int64_t steps);
// "[rank K] weights checksum: X | committed steps S | ..." -> K -> (X, S)
std::map<int, std::pair<std::string, std::int64_t>> checksums(const std::string& out);
// Exit 0, `nproc` ranks ending with one checksum and `steps` committed steps,
// and a ledger without a lost or repeated sample.
void expect_healed(const HealRun& run, int nproc, std::int64_t steps);
// Whether rank `id` dropped out of some epoch: left, or already replaced by
// its relaunch when the survivors' reform admitted it at once.
bool dropped(const std::string& out, int id);
std::size_t count_of(const std::string& text, const std::string& what);
// SIGKILLs the process of rank `id` from outside, mid-step, once it has
// committed `steps` steps (its own ledger, slog.ID.PID, names its pid).
// False when that does not happen within a minute.
bool kill_after_committing(const std::string& dir, int id, int steps);

}  // namespace ddp::testing
