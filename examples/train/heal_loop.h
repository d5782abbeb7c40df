#pragma once
// The trainer under ddprun --on_failure=heal (docs/heal.md): a lost rank
// costs the step in flight, not a restart. The survivors rebuild the group
// (ddp::Healer) and go on; a relaunched rank receives the weights, the
// optimizer state, the step count and the data position from a live rank
// and joins at a step boundary. Every rank prints "weights checksum: <hex>"
// at the end, and one line per recovery.

#include <functional>
#include <string>
#include <vector>

#include "data.h"
#include "flags.h"
#include "trainer.h"

namespace train {

// Trains under live recovery; returns the exit code (0, or 1 after an error
// it logged). `dims`: the MLP's layer widths.
int run_healing(const Config& config, const Data& data, const std::vector<int>& dims,
                const std::string& backend, const Hooks& hooks);

}  // namespace train
