#pragma once
// The trainer as a function: main.cc's main() is run_trainer(argv). A program
// may pass hooks to act between steps and around a heal (the fault-injecting
// workers in tests/tools kill, stop or delay a rank there).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace train {

// Called on every rank after each optimizer step and its checkpoint, with the
// number of steps done.
using AfterStep = std::function<void(std::int64_t steps_done)>;

// What a caller runs at points of the training loop; each may be empty.
struct Hooks {
  AfterStep after_step;
  // Under ddprun --on_failure=heal, on every member: after a collective of
  // the group failed, before it reforms; after each reform, before the
  // state is exchanged; and before the model is allocated (the Healer is
  // already forming the first epoch or asking to be admitted).
  std::function<void()> before_reform, after_reform, before_model;
  // Under heal, after the step's gradients were averaged, before its
  // optimizer update; `step`: the committed count the update would make.
  AfterStep before_update;
  // Under heal, after each forward pass of the step that would make `step`
  // committed, before the rank looks whether its peers are still there.
  AfterStep after_forward;
  // Under heal, on every member: once a reform's state exchange is done and
  // the group is settled (its GradSync built), before the next step.
  std::function<void()> after_settle;
};

// Parses argv (argv[0]: the program) and trains. Returns the exit code: 0;
// 1 after a failure, logged; 2 for bad flags, one line on stderr (help: 0,
// on stdout).
int run_trainer(const std::vector<std::string>& argv, const Hooks& hooks = {});

}  // namespace train
