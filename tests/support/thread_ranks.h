#pragma once
// Test support: ranks as threads of one process, each with its own process
// group over one in-memory store (fast, and no processes to manage).

#include <chrono>
#include <functional>

#include "ddp/process_group.h"

namespace ddp::testing {

ProcessGroupOptions gloo_options(std::chrono::milliseconds timeout = std::chrono::seconds(20));

// Runs body(group) on `world` ranks, each a thread with its own group (Gloo,
// or local for a world of one), created concurrently (creation waits for
// every rank) under a store prefix of its own. Groups are destroyed only
// after every rank's body returned. An exception fails the test, naming the rank.
void on_ranks(int world, const std::function<void(ProcessGroup&)>& body,
              const ProcessGroupOptions& options = gloo_options());

}  // namespace ddp::testing
