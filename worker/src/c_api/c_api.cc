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

// ---- GradSync (appended) ----

#include <memory>
#include <vector>

#include "ddp/grad_sync.h"
#include "ddp/shared_grad_sum.h"

// A GradSync, or a SharedGradSum for DDP_COMM_SHARED; the calls one of them
// lacks fail with the reason.
struct ddp_grad_sync {
  std::unique_ptr<ddp::GradAverager> sync;
  std::vector<ddp::GradAverager::NoSync> no_sync;  // open ddp_grad_sync_no_sync_begin scopes
};

namespace {

ddp::GradAverager& checked(ddp_grad_sync* gs) {
  if (gs == nullptr || !gs->sync) throw ddp::Error("the ddp_grad_sync handle is NULL");
  return *gs->sync;
}

// The handle's GradSync; throws for a shared sum, saying why `what` needs buckets.
ddp::GradSync& buckets(ddp_grad_sync* gs, const char* what) {
  auto* sync = dynamic_cast<ddp::GradSync*>(&checked(gs));
  if (sync == nullptr) {
    throw ddp::Error(std::string(what) +
                     ": comm_mode shared adds gradients up as they are written and has no buckets; "
                     "hand gradients over with ddp_grad_sync_contribute() (contribute()) or "
                     "add_grad/set_grad");
  }
  return *sync;
}

// The C parameter list as GradSync's and ParamShards' (one-dimensional).
std::vector<ddp::GradParam> to_grad_params(const ddp_param_t* params, size_t n) {
  if (params == nullptr && n > 0) {
    throw ddp::Error("params is NULL for " + std::to_string(n) + " parameters");
  }
  std::vector<ddp::GradParam> list;
  for (size_t i = 0; i < n; ++i) {
    ddp::GradParam p;
    p.name = params[i].name != nullptr ? params[i].name : "";
    p.shape = {static_cast<std::int64_t>(params[i].count)};
    p.dtype = to_dtype(params[i].dtype);
    p.device = params[i].device;
    p.requires_grad = params[i].requires_grad != 0;
    list.push_back(std::move(p));
  }
  return list;
}

void fill_stats(const ddp::IterationStats& s, ddp_grad_sync_stats_t* out) {
  if (out == nullptr) return;
  out->iteration = s.iteration;
  out->synced = s.synced ? 1 : 0;
  out->backward_compute_ms = s.backward_compute_ms;
  out->comm_ms = s.comm_ms;
  out->overlap_ms = s.overlap_ms;
  out->exposed_comm_ms = s.exposed_comm_ms;
  out->inline_comm_ms = s.inline_comm_ms;
  out->buckets = s.buckets;
  out->bytes_on_wire = s.bytes_on_wire;
}

}  // namespace

static_assert(DDP_COMM_OVERLAP == static_cast<int>(ddp::CommMode::kOverlap) &&
              DDP_COMM_INLINE == static_cast<int>(ddp::CommMode::kInline) &&
              DDP_COMM_SHARED == static_cast<int>(ddp::CommMode::kShared));

extern "C" {

int ddp_grad_sync_default_options(ddp_grad_sync_options_t* out) {
  return guarded("ddp_grad_sync_default_options", [&] {
    if (out == nullptr) throw ddp::Error("out is NULL");
    ddp::GradSyncOptions d;
    out->bucket_cap_bytes = d.bucket_cap_bytes;
    out->first_bucket_bytes = d.first_bucket_bytes;
    out->compression = static_cast<int>(d.compression);
    out->find_unused_parameters = d.find_unused_parameters ? 1 : 0;
    out->prescaled_grads = d.prescaled_grads ? 1 : 0;
    out->log_every = d.log_every;
    out->comm_mode = static_cast<int>(d.comm_mode);
    out->shared_block_bytes = d.shared_block_bytes;
    return 0;
  });
}

int ddp_grad_sync_create(const ddp_param_t* params, size_t n,
                         const ddp_grad_sync_options_t* options, ddp_grad_sync** out) {
  return guarded("ddp_grad_sync_create", [&] {
    if (out == nullptr) throw ddp::Error("out is NULL");
    *out = nullptr;
    std::vector<ddp::GradParam> list = to_grad_params(params, n);
    ddp::GradSyncOptions o;
    if (options != nullptr) {
      if (options->compression < DDP_COMPRESS_NONE || options->compression > DDP_COMPRESS_BF16) {
        throw ddp::Error("compression " + std::to_string(options->compression) +
                         " is not a DDP_COMPRESS_* value");
      }
      o.bucket_cap_bytes = options->bucket_cap_bytes;
      o.first_bucket_bytes = options->first_bucket_bytes;
      o.compression = static_cast<ddp::Compression>(options->compression);
      o.find_unused_parameters = options->find_unused_parameters != 0;
      o.prescaled_grads = options->prescaled_grads != 0;
      o.log_every = options->log_every;
      if (options->comm_mode < DDP_COMM_OVERLAP || options->comm_mode > DDP_COMM_SHARED) {
        throw ddp::Error("comm_mode " + std::to_string(options->comm_mode) +
                         " is not a DDP_COMM_* value");
      }
      o.comm_mode = static_cast<ddp::CommMode>(options->comm_mode);
      if (options->shared_block_bytes != 0) o.shared_block_bytes = options->shared_block_bytes;
    }
    auto handle = std::make_unique<ddp_grad_sync>();
    handle->sync = ddp::make_grad_averager(ddp::default_group(), std::move(list), o);
    *out = handle.release();
    return 0;
  });
}

int ddp_grad_sync_prepare(ddp_grad_sync* gs, void* const* param_data, size_t n,
                          void* const* buffers, const size_t* buffer_counts,
                          const int* buffer_dtypes, size_t n_buffers) {
  return guarded("ddp_grad_sync_prepare", [&] {
    ddp::GradAverager& sync = checked(gs);
    if (param_data == nullptr && n > 0) throw ddp::Error("param_data is NULL");
    if (n_buffers > 0 &&
        (buffers == nullptr || buffer_counts == nullptr || buffer_dtypes == nullptr)) {
      throw ddp::Error("buffers, buffer_counts or buffer_dtypes is NULL for " +
                       std::to_string(n_buffers) + " buffers");
    }
    std::vector<void*> data(param_data, param_data + n);
    std::vector<ddp::ParamBuffer> bufs;
    for (size_t i = 0; i < n_buffers; ++i)
      bufs.push_back({buffers[i], buffer_counts[i], to_dtype(buffer_dtypes[i])});
    sync.prepare(data, bufs);
    return 0;
  });
}

int ddp_grad_sync_grad(ddp_grad_sync* gs, size_t index, void** out) {
  return guarded("ddp_grad_sync_grad", [&] {
    ddp::GradAverager& sync = checked(gs);
    if (out == nullptr) throw ddp::Error("out is NULL");
    *out = sync.grad(index);
    return 0;
  });
}

int ddp_grad_sync_set_grad(ddp_grad_sync* gs, size_t index, const void* src) {
  return guarded("ddp_grad_sync_set_grad", [&] {
    checked(gs).set_grad(index, src);
    return 0;
  });
}

int ddp_grad_sync_add_grad(ddp_grad_sync* gs, size_t index, const void* src) {
  return guarded("ddp_grad_sync_add_grad", [&] {
    checked(gs).add_grad(index, src);
    return 0;
  });
}

int ddp_grad_sync_zero_grad(ddp_grad_sync* gs) {
  return guarded("ddp_grad_sync_zero_grad", [&] {
    checked(gs).zero_grad();
    return 0;
  });
}

int ddp_grad_sync_set_needed_gradients(ddp_grad_sync* gs, const size_t* begins, const size_t* ends,
                                       size_t n) {
  return guarded("ddp_grad_sync_set_needed_gradients", [&] {
    ddp::GradAverager& sync = checked(gs);
    if (n > 0 && (begins == nullptr || ends == nullptr))
      throw ddp::Error("begins and ends must not be NULL");
    std::vector<ddp::ElementRange> ranges;
    for (size_t i = 0; i < n; ++i) ranges.push_back({begins[i], ends[i]});
    sync.set_needed_gradients(std::move(ranges));
    return 0;
  });
}

int ddp_grad_sync_set_first_bucket_bytes(ddp_grad_sync* gs, size_t bytes) {
  return guarded("ddp_grad_sync_set_first_bucket_bytes", [&] {
    buckets(gs, "set_first_bucket_bytes").set_first_bucket_bytes(bytes);
    return 0;
  });
}

int ddp_grad_sync_layout_version(ddp_grad_sync* gs, int* out) {
  return guarded("ddp_grad_sync_layout_version", [&] {
    ddp::GradAverager& sync = checked(gs);
    if (out == nullptr) throw ddp::Error("out is NULL");
    auto* bucketed = dynamic_cast<ddp::GradSync*>(&sync);
    *out = bucketed != nullptr ? bucketed->layout_version() : 0;  // a shared sum never moves
    return 0;
  });
}

int ddp_grad_sync_begin_backward(ddp_grad_sync* gs) {
  return guarded("ddp_grad_sync_begin_backward", [&] {
    checked(gs).begin_backward();
    return 0;
  });
}

int ddp_grad_sync_contribute(ddp_grad_sync* gs, size_t index, ddp_grad_block_writer write,
                             void* user) {
  return guarded("ddp_grad_sync_contribute", [&] {
    ddp::GradAverager* sync = &checked(gs);
    if (write == nullptr) throw ddp::Error("write is NULL");
    sync->contribute(index, [&](const ddp::GradBlock& b) {
      const ddp_grad_block_t block{b.data,         b.row_begin,          b.rows,
                                   b.row_elements, b.accumulate ? 1 : 0, b.scale};
      if (const int code = write(&block, user); code != 0) {
        throw ddp::Error("the writer of parameter '" + sync->param(index).name + "' returned " +
                         std::to_string(code) + " for its rows [" + std::to_string(b.row_begin) +
                         ", " + std::to_string(b.row_begin + b.rows) + ")");
      }
    });
    return 0;
  });
}

int ddp_grad_sync_mark_ready(ddp_grad_sync* gs, size_t index) {
  return guarded("ddp_grad_sync_mark_ready", [&] {
    buckets(gs, "mark_ready").mark_ready(index);
    return 0;
  });
}

int ddp_grad_sync_finish(ddp_grad_sync* gs) {
  return guarded("ddp_grad_sync_finish", [&] {
    checked(gs).finish();
    return 0;
  });
}

int ddp_grad_sync_no_sync_begin(ddp_grad_sync* gs) {
  return guarded("ddp_grad_sync_no_sync_begin", [&] {
    gs->no_sync.push_back(checked(gs).no_sync());
    return 0;
  });
}

int ddp_grad_sync_no_sync_end(ddp_grad_sync* gs) {
  return guarded("ddp_grad_sync_no_sync_end", [&] {
    checked(gs);
    if (!gs->no_sync.empty()) gs->no_sync.pop_back();
    return 0;
  });
}

int ddp_grad_sync_stats(ddp_grad_sync* gs, ddp_grad_sync_stats_t* last,
                        ddp_grad_sync_stats_t* mean) {
  return guarded("ddp_grad_sync_stats", [&] {
    ddp::GradSyncStats s = checked(gs).stats();
    fill_stats(s.last, last);
    fill_stats(s.mean, mean);
    return 0;
  });
}

int ddp_grad_sync_destroy(ddp_grad_sync* gs) {
  return guarded("ddp_grad_sync_destroy", [&] {
    delete gs;
    return 0;
  });
}

}  // extern "C"

// ---- ParamShards (appended) ----

#include "ddp/param_shards.h"

struct ddp_param_shards {
  std::unique_ptr<ddp::ParamShards> shards;
};

namespace {

ddp::ParamShards& checked(ddp_param_shards* ps) {
  if (ps == nullptr || !ps->shards) throw ddp::Error("the ddp_param_shards handle is NULL");
  return *ps->shards;
}

}  // namespace

extern "C" {

int ddp_param_shards_create(const ddp_param_t* params, size_t n, ddp_param_shards** out) {
  return guarded("ddp_param_shards_create", [&] {
    if (out == nullptr) throw ddp::Error("out is NULL");
    *out = nullptr;
    auto handle = std::make_unique<ddp_param_shards>();
    handle->shards =
        std::make_unique<ddp::ParamShards>(ddp::default_group(), to_grad_params(params, n));
    *out = handle.release();
    return 0;
  });
}

int ddp_param_shards_data(ddp_param_shards* ps, size_t index, void** out) {
  return guarded("ddp_param_shards_data", [&] {
    if (out == nullptr) throw ddp::Error("out is NULL");
    *out = checked(ps).data(index);
    return 0;
  });
}

int ddp_param_shards_owned(ddp_param_shards* ps, size_t index, size_t* begin, size_t* end) {
  return guarded("ddp_param_shards_owned", [&] {
    if (begin == nullptr || end == nullptr) throw ddp::Error("begin or end is NULL");
    const ddp::ElementRange mine = checked(ps).owned(index);
    *begin = mine.begin;
    *end = mine.end;
    return 0;
  });
}

int ddp_param_shards_node_shared(ddp_param_shards* ps, int* out) {
  return guarded("ddp_param_shards_node_shared", [&] {
    if (out == nullptr) throw ddp::Error("out is NULL");
    *out = checked(ps).node_shared() ? 1 : 0;
    return 0;
  });
}

int ddp_param_shards_all_gather(ddp_param_shards* ps) {
  return guarded("ddp_param_shards_all_gather", [&] {
    checked(ps).all_gather();
    return 0;
  });
}

int ddp_param_shards_all_gather_buffers(ddp_param_shards* ps, void* const* buffers, size_t n) {
  return guarded("ddp_param_shards_all_gather_buffers", [&] {
    ddp::ParamShards& shards = checked(ps);
    if (n != shards.num_params()) {
      throw ddp::Error(std::to_string(n) + " buffers for " + std::to_string(shards.num_params()) +
                       " parameters");
    }
    if (buffers == nullptr && n > 0) throw ddp::Error("buffers is NULL");
    shards.all_gather(std::vector<void*>(buffers, buffers + n));
    return 0;
  });
}

int ddp_param_shards_destroy(ddp_param_shards* ps) {
  return guarded("ddp_param_shards_destroy", [&] {
    delete ps;
    return 0;
  });
}

}  // extern "C"
