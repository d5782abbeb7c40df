#pragma once
// --on_failure=heal: what the agent does with a failed (or hung) worker, and
// the lines it says. Pure logic, unit-tested without processes; the RankRelauncher
// (rank_relauncher.h) carries it out.
//
// A rank that ended badly while the group was not stopping is relaunched
// alone when its program opted into healing (its heal mark exists) and the
// job's restart budget (--max_restarts, which group restarts spend too) has a
// restart left; the other ranks go on untouched. Otherwise the failure is
// handled as with --on_failure=restart: the group is stopped and restarted
// while restarts remain, else the job fails with the usual report. A hang
// (--hang_timeout) is healed by killing the blamed ranks and relaunching them,
// when each of them opted in, some rank is not blamed (someone must be alive
// to heal from) and enough restarts are left for all of them.

#include <cstddef>
#include <string>

#include "worker_group/failure_report.h"

namespace ddp::launcher {

enum class HealStep {
  kRelaunch,   // start the rank again alone, spending one restart
  kAsRestart,  // as --on_failure=restart: stop the group (restart it or fail)
};

// `restarts_left`: what remains of --max_restarts in the job.
HealStep heal_step(bool opted_in, int restarts_left);

// Whether a hang that blamed `blamed` of the `workers` ranks, `opted_in` of
// the blamed ones having opted in, is healed (the blamed ranks killed and
// relaunched) rather than stopping the group.
bool heal_takes_hang(std::size_t blamed, std::size_t opted_in, std::size_t workers,
                     int restarts_left);

// How the rank ended, for the heal lines: "exited with exit code 3",
// "exited with signal 9 (SIGKILL)", "made no progress for --hang_timeout and
// was killed".
std::string how_it_ended(const WorkerOutcome& failed);

// "rank 2 (local rank 2) exited with signal 9 (SIGKILL): relaunching it
// (relaunch 1 of 3); the other ranks go on". `relaunch`: restarts spent so
// far, this one included.
std::string relaunch_line(const WorkerOutcome& failed, int relaunch, int max_restarts);

// "rank 2 had not opted into healing (libddp's healing API); restarting the
// group as --on_failure=restart would" (`restarts_left` 0: "handling its
// failure as --on_failure=restart would").
std::string not_opted_in_line(const WorkerOutcome& failed, int restarts_left);

}  // namespace ddp::launcher
