#pragma once
// libddp's Store interface over the store torch hands a backend (TCPStore,
// FileStore, a subgroup's PrefixStore): libddp's groups rendezvous through
// whatever init_process_group was given, under ddprun or torchrun alike.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ddp/store.h"

namespace ddprun_torch {

// Thread-safe as the wrapped store is (torch's stores lock each call).
// Errors are ddp::Error naming the key.
std::shared_ptr<ddp::Store> wrap_torch_store(c10::intrusive_ptr<c10d::Store> store);

}  // namespace ddprun_torch
