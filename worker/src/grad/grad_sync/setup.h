#pragma once
// What GradSync and SharedGradSum check before they allocate anything
// (internal): the options and parameters on this rank, then, in one
// collective, that every rank has the same options and no rank found a
// problem, then check_same_params. Each throws ddp::Error on every rank
// alike, prefixed by `who` ("GradSync", "SharedGradSum").

#include <string>
#include <vector>

#include "ddp/grad_averager.h"
#include "ddp/process_group.h"

namespace ddp::detail {

// The first problem with these options and parameters on this group, or "".
// options.comm_mode says which class asks (kShared: SharedGradSum).
std::string check_setup(const ProcessGroup& group, const std::vector<GradParam>& params,
                        const GradSyncOptions& options);

// Collective: every rank's `problem` and options (log_every aside; kOverlap
// and kInline count as one, since they issue the same collectives), then
// check_same_params. Throws naming the first rank with a problem, or a rank
// whose options differ from the majority's and the option that differs.
void agree_on_setup(ProcessGroup& group, const std::vector<GradParam>& params,
                    const GradSyncOptions& options, const std::string& problem, const char* who);

}  // namespace ddp::detail
