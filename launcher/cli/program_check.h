#pragma once
// The program a launch runs: under which interpreter, and whether it can
// run at all (checked before anything starts, naming what is wrong).

#include "cli/launch_spec.h"

namespace ddp::launcher {

// The interpreter (DDP_PYTHON, else torchrun's PYTHON_EXEC, else python3;
// spec.python_source names the variable) and whether the program runs
// under it (spec.python_program).
void apply_python(LaunchSpec& spec);

// Throws ddp::Error naming the program (or the interpreter's variable) when
// it cannot run: missing, a directory, not readable, not executable, not
// on PATH.
void check_program(const LaunchSpec& spec);

}  // namespace ddp::launcher
