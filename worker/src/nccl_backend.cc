// The NCCL backend. This build's NCCL support is added in a later change; until
// then asking for it is a clear error.

#include "backend.h"
#include "ddp/common/error.h"

namespace ddp {

std::unique_ptr<Backend> make_nccl_backend(const BackendConfig&) {
  throw Error("backend 'nccl' is not available in this build of libddp yet (use DDP_BACKEND=gloo)");
}

}  // namespace ddp
