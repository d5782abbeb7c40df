#include "agent/heal_policy.h"

#include "worker_group/process.h"

namespace ddp::launcher {

HealStep heal_step(bool opted_in, int restarts_left) {
  return opted_in && restarts_left > 0 ? HealStep::kRelaunch : HealStep::kAsRestart;
}

bool heal_takes_hang(std::size_t blamed, std::size_t opted_in, std::size_t workers,
                     int restarts_left) {
  return blamed > 0 && opted_in == blamed && blamed < workers &&
         static_cast<std::size_t>(restarts_left < 0 ? 0 : restarts_left) >= blamed;
}

std::string how_it_ended(const WorkerOutcome& failed) {
  if (failed.hung) return "made no progress for --hang_timeout and was killed";
  if (!failed.signaled) return "exited with exit code " + std::to_string(failed.code);
  return "exited with signal " + std::to_string(failed.code) + " (" + signal_name(failed.code) +
         ")";
}

std::string relaunch_line(const WorkerOutcome& failed, int relaunch, int max_restarts) {
  return "rank " + std::to_string(failed.rank) + " (local rank " +
         std::to_string(failed.local_rank) + ") " + how_it_ended(failed) +
         ": relaunching it (relaunch " + std::to_string(relaunch) + " of " +
         std::to_string(max_restarts) + "); the other ranks go on";
}

std::string not_opted_in_line(const WorkerOutcome& failed, int restarts_left) {
  return "rank " + std::to_string(failed.rank) +
         " had not opted into healing (libddp's healing API); " +
         (restarts_left > 0 ? "restarting the group" : "handling its failure") +
         " as --on_failure=restart would";
}

}  // namespace ddp::launcher
