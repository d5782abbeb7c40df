#pragma once
// The trainer as a function: main.cc's main() is run_trainer(argv). A program
// may pass after_step to act between steps (tests/tools/train_fault_worker.cc
// kills or stops a rank there).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace train {

// Called on every rank after each optimizer step and its checkpoint, with the
// number of steps done.
using AfterStep = std::function<void(std::int64_t steps_done)>;

// Parses argv (argv[0]: the program) and trains. Returns the exit code: 0;
// 1 after a failure, logged; 2 for bad flags, one line on stderr (help: 0,
// on stdout).
// Under ddprun --on_failure=heal, after_reform runs on every member each
// time the group was rebuilt, before the state is exchanged (the heal tests
// kill a rank there).
int run_trainer(const std::vector<std::string>& argv, const AfterStep& after_step = nullptr,
                const std::function<void()>& after_reform = nullptr);

}  // namespace train
