#pragma once
// ddprun status on the wire: observe/job_status.h's plain data to and from
// ddp.v1.NodeState / StatusResponse (rendezvous.proto). Pure conversions.

#include "ddp/v1/rendezvous.pb.h"
#include "observe/job_status.h"

namespace ddp::launcher {

v1::NodeState to_proto(const NodeStatus& node);
NodeStatus from_proto(const v1::NodeState& state);
// The job as the server answered (`endpoint`: where it was asked).
JobStatus job_from_proto(const v1::StatusResponse& resp, const std::string& endpoint);

}  // namespace ddp::launcher
