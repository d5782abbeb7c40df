#include "ddp/common/grpc_logging.h"

#include <grpc/support/log.h>

#include <cstdio>
#include <cstdlib>

namespace ddp {
namespace {

void forward(gpr_log_func_args* args) {
  std::fprintf(stderr, "[grpc] %s:%d %s\n", args->file, args->line, args->message);
}

void drop(gpr_log_func_args*) {}

}  // namespace

void route_grpc_logs() {
  const char* want = std::getenv("DDP_GRPC_LOGS");
  gpr_set_log_function(want != nullptr && *want == '1' ? forward : drop);
}

}  // namespace ddp
