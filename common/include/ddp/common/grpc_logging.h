#pragma once
// gRPC prints its own diagnostics to stderr (e.g. a failed bind as a long
// "E1122 chttp2_server..." line) before our error says the same thing in one
// line. This routes them to spdlog at debug level instead; set DDP_GRPC_LOGS=1
// to see them. Call once, early, before any gRPC object exists.

namespace ddp {

void route_grpc_logs();

}  // namespace ddp
