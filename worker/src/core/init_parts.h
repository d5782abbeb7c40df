#pragma once
// What init() makes groups from, shared with the Healer (internal): the
// environment contract, the group options it implies, and the job's store.

#include <memory>
#include <optional>
#include <string>

#include "ddp/common/env_contract.h"
#include "ddp/ddp.h"

namespace ddp::detail {

// The contract as this process was launched with it (parsed once).
const std::optional<WorkerEnv>& worker_env();
// The options of a group named `name` over the job's ranks; backend "local"
// in a world of one. Throws ddp::Error naming a malformed variable.
ProcessGroupOptions group_options(const std::string& name, const InitOptions& options);
// The rendezvous store every group of this process shares (unscoped).
// REQUIRES: launched (worker_env() has a value). Throws ddp::Error naming
// DDP_RDZV_ENDPOINT when there is no rendezvous.
std::shared_ptr<Store> job_store();

}  // namespace ddp::detail
