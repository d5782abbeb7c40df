// The C API: each entry point runs the C++ call inside a catch-all, so no
// exception crosses into C; a failure becomes -1 and a per-thread message.

#include "ddp/ddp_c.h"

#include <exception>
#include <string>

#include "ddp/common/error.h"
#include "ddp/ddp.h"

namespace {

// The C constants are the C++ enums' values.
static_assert(DDP_FLOAT32 == static_cast<int>(ddp::DType::kFloat32));
static_assert(DDP_FLOAT64 == static_cast<int>(ddp::DType::kFloat64));
static_assert(DDP_FLOAT16 == static_cast<int>(ddp::DType::kFloat16));
static_assert(DDP_BFLOAT16 == static_cast<int>(ddp::DType::kBFloat16));
static_assert(DDP_INT32 == static_cast<int>(ddp::DType::kInt32));
static_assert(DDP_INT64 == static_cast<int>(ddp::DType::kInt64));
static_assert(DDP_UINT8 == static_cast<int>(ddp::DType::kUInt8));
static_assert(DDP_SUM == static_cast<int>(ddp::ReduceOp::kSum));
static_assert(DDP_AVG == static_cast<int>(ddp::ReduceOp::kAvg));
static_assert(DDP_MIN == static_cast<int>(ddp::ReduceOp::kMin));
static_assert(DDP_MAX == static_cast<int>(ddp::ReduceOp::kMax));
static_assert(DDP_PRODUCT == static_cast<int>(ddp::ReduceOp::kProduct));

thread_local std::string t_last_error;

// Runs `f` (returning int); any exception becomes -1 with its message.
template <class F>
int guarded(const char* what, F&& f) noexcept {
  try {
    return f();
  } catch (const std::exception& e) {
    t_last_error = std::string(what) + ": " + e.what();
  } catch (...) {
    t_last_error = std::string(what) + ": unknown error";
  }
  return -1;
}

ddp::DType to_dtype(int dtype) {
  if (dtype < DDP_FLOAT32 || dtype > DDP_UINT8) {
    throw ddp::Error("dtype " + std::to_string(dtype) + " is not a DDP_* dtype (expected " +
                     std::to_string(DDP_FLOAT32) + ".." + std::to_string(DDP_UINT8) + ")");
  }
  return static_cast<ddp::DType>(dtype);
}

ddp::ReduceOp to_op(int op) {
  if (op < DDP_SUM || op > DDP_PRODUCT) {
    throw ddp::Error("op " + std::to_string(op) + " is not a DDP_* reduce op (expected " +
                     std::to_string(DDP_SUM) + ".." + std::to_string(DDP_PRODUCT) + ")");
  }
  return static_cast<ddp::ReduceOp>(op);
}

void check_data(const void* data, size_t count) {
  if (data == nullptr && count > 0) {
    throw ddp::Error("data is NULL for " + std::to_string(count) + " elements");
  }
}

}  // namespace

extern "C" {

int ddp_init(const char* backend_or_null) {
  return guarded("ddp_init", [&] {
    ddp::InitOptions options;
    if (backend_or_null != nullptr) options.backend = backend_or_null;
    ddp::init(options);
    return 0;
  });
}

int ddp_rank(void) {
  return guarded("ddp_rank", [] { return ddp::rank(); });
}

int ddp_world_size(void) {
  return guarded("ddp_world_size", [] { return ddp::world_size(); });
}

int ddp_local_rank(void) {
  return guarded("ddp_local_rank", [] { return ddp::local_rank(); });
}

int ddp_all_reduce(void* data, size_t count, int dtype, int op) {
  return guarded("ddp_all_reduce", [&] {
    ddp::DType d = to_dtype(dtype);
    ddp::ReduceOp o = to_op(op);
    check_data(data, count);
    ddp::default_group().all_reduce(data, count, d, o);
    return 0;
  });
}

int ddp_broadcast(void* data, size_t count, int dtype, int root) {
  return guarded("ddp_broadcast", [&] {
    ddp::DType d = to_dtype(dtype);
    check_data(data, count);
    ddp::default_group().broadcast(data, count, d, root);
    return 0;
  });
}

int ddp_barrier(void) {
  return guarded("ddp_barrier", [] {
    ddp::default_group().barrier();
    return 0;
  });
}

int ddp_shutdown(void) {
  return guarded("ddp_shutdown", [] {
    ddp::shutdown();
    return 0;
  });
}

const char* ddp_last_error(void) { return t_last_error.c_str(); }

}  // extern "C"
