// The reference trainer (examples/train) with two faults to inject,
// for its restart and hang tests (tests/integration/train_test.cc):
//
//   train_fault_worker [--crash_at_step K] [--stall_at_step K] TRAIN_FLAGS...
//
// After step K (in the first attempt only: TORCHELASTIC_RESTART_COUNT 0) the
// last rank kills itself with SIGKILL (--crash_at_step), or stops itself
// with SIGSTOP (--stall_at_step): alive but silent, as a hung rank is.
// Everything else is train's: its flags, output and exit codes.

#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ddp/ddp.h"
#include "ddp/log.h"
#include "trainer.h"

int main(int argc, char** argv) {
  std::int64_t crash_at = 0, stall_at = 0;
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--crash_at_step" || arg == "--stall_at_step") && i + 1 < argc) {
      (arg == "--crash_at_step" ? crash_at : stall_at) = std::atoll(argv[++i]);
    } else {
      args.push_back(arg);
    }
  }
  const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const bool first_attempt = attempt == nullptr || std::string(attempt) == "0";
  const bool last_rank = ddp::rank() == ddp::world_size() - 1;
  train::Hooks hooks;
  hooks.after_step = [&](std::int64_t step) {
    if (!first_attempt || !last_rank) return;
    if (step == crash_at) {
      ddp::log::warn("--crash_at_step {}: killing this rank (SIGKILL)", step);
      ::kill(::getpid(), SIGKILL);
    }
    if (step == stall_at) {
      ddp::log::warn("--stall_at_step {}: stopping this rank (SIGSTOP)", step);
      ::kill(::getpid(), SIGSTOP);
    }
  };
  return train::run_trainer(args, hooks);
}
