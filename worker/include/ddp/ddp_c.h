/* libddp's C API: for C programs and for other languages that load
 * libddp.so (Python's ctypes, Rust, Go, Julia...).
 *
 * Every function returns 0 (or a rank/size >= 0) on success and -1 on
 * failure; after a failure ddp_last_error() tells what went wrong. No C++
 * exception ever crosses this boundary. The collectives act on the default
 * group that ddp_init() creates from ddprun's environment (a world of one
 * without it), on host memory for the gloo backend.
 *
 * Thread-safety: like the C++ API; the last error is per thread. */
#ifndef DDP_DDP_C_H_
#define DDP_DDP_C_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define DDP_C_API __attribute__((visibility("default")))
#else
#define DDP_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Element types: the order of ddp::DType. */
enum {
  DDP_FLOAT32 = 0,
  DDP_FLOAT64 = 1,
  DDP_FLOAT16 = 2,
  DDP_BFLOAT16 = 3,
  DDP_INT32 = 4,
  DDP_INT64 = 5,
  DDP_UINT8 = 6
};

/* Reduction operations: the order of ddp::ReduceOp. DDP_AVG divides the sum
 * by the world size (integer types: truncating). */
enum { DDP_SUM = 0, DDP_AVG = 1, DDP_MIN = 2, DDP_MAX = 3, DDP_PRODUCT = 4 };

/* Creates the default group from the environment (ddp::init()). `backend`:
 * "shm", "gloo", "nccl", "local", or NULL/"" for the default (DDP_BACKEND,
 * else nccl when a GPU is visible, else shm when some node runs several
 * ranks, else gloo). Calling it again returns 0 and keeps the existing group. */
DDP_C_API int ddp_init(const char* backend_or_null);

/* This process's rank, world size and local rank from the environment
 * contract (valid before ddp_init(): 0, 1, 0 in a world of one); -1 when
 * the environment is malformed. */
DDP_C_API int ddp_rank(void);
DDP_C_API int ddp_world_size(void);
DDP_C_API int ddp_local_rank(void);

/* In place: data[i] = op over ranks of data[i]; `count` elements of `dtype`
 * (a DDP_* type), `op` a DDP_* operation. REQUIRES: ddp_init(). */
DDP_C_API int ddp_all_reduce(void* data, size_t count, int dtype, int op);
/* In place: every rank's data becomes rank `root`'s. REQUIRES: ddp_init(). */
DDP_C_API int ddp_broadcast(void* data, size_t count, int dtype, int root);
/* Returns when every rank has called it. REQUIRES: ddp_init(). */
DDP_C_API int ddp_barrier(void);
/* Destroys the default group (waits for issued collectives). Idempotent. */
DDP_C_API int ddp_shutdown(void);

/* The message of this thread's last failure ("" when none). Valid until the
 * thread's next failing call. */
DDP_C_API const char* ddp_last_error(void);

/* ---- Gradient synchronisation (ddp::GradSync, see ddp/grad_sync.h) ----
 * Bucketed, overlapped averaging of gradients over the default group:
 *   ddp_grad_sync_create(params, n, NULL, &gs);      (collective)
 *   each step: write grads into ddp_grad_sync_grad() pointers (or use
 *   ddp_grad_sync_add_grad), ddp_grad_sync_mark_ready() each parameter,
 *   ddp_grad_sync_finish() (collective), optimizer step.
 * Parameters are named by their index in `params`. Gradient pointers move
 * once, at the end of the first successful finish() (the layout is rebuilt
 * from the observed gradient order): fetch them after finish() or every step.
 * REQUIRES: ddp_init(). */
typedef struct ddp_grad_sync ddp_grad_sync;

typedef struct {
  const char* name;  /* unique; copied */
  size_t count;      /* elements */
  int dtype;         /* DDP_FLOAT32, DDP_FLOAT64, DDP_FLOAT16 or DDP_BFLOAT16 */
  int device;        /* -1: host memory; >= 0: CUDA device (nccl) */
  int requires_grad; /* 0: frozen (checked and broadcast, no gradient) */
} ddp_param_t;

enum { DDP_COMPRESS_NONE = 0, DDP_COMPRESS_FP16 = 1, DDP_COMPRESS_BF16 = 2 };
/* How gradients are averaged (GradSync's CommMode): bucket all-reduces on the
 * group's thread or on the caller's, or the shared sum (ranks of one node
 * under shm: gradients handed over with ddp_grad_sync_contribute). */
enum { DDP_COMM_OVERLAP = 0, DDP_COMM_INLINE = 1, DDP_COMM_SHARED = 2 };

typedef struct {
  size_t bucket_cap_bytes;    /* default 25 MiB */
  size_t first_bucket_bytes;  /* default 1 MiB */
  int compression;            /* DDP_COMPRESS_* */
  int find_unused_parameters; /* 0 or 1 */
  int prescaled_grads;        /* 1: gradient writes already carry 1/world_size */
  int log_every;              /* rank 0 logs stats at iterations 1-10, then every log_every */
  int comm_mode;              /* DDP_COMM_* (default DDP_COMM_OVERLAP) */
  size_t shared_block_bytes;  /* DDP_COMM_SHARED: block size (default 256 KiB; 0: the default) */
} ddp_grad_sync_options_t;

/* One block of a gradient handed to a writer (DDP_COMM_SHARED): rows
 * [row_begin, row_begin + rows) of row_elements elements each (a C API
 * parameter is one-dimensional: one element per row) at `data`, inside the
 * node's sum. accumulate 0: store scale * gradient; 1: add it. */
typedef struct {
  void* data;
  int64_t row_begin;
  int64_t rows;
  size_t row_elements;
  int accumulate;
  float scale; /* 1 / world_size */
} ddp_grad_block_t;
/* Returns 0, or non-zero to fail the hand-over (the iteration is then lost
 * on every rank, and ddp_grad_sync_contribute fails). */
typedef int (*ddp_grad_block_writer)(const ddp_grad_block_t* block, void* user);

typedef struct {
  unsigned long long iteration; /* 1-based count of finish() calls */
  int synced;                   /* 0: a no_sync iteration */
  double backward_compute_ms;
  double comm_ms;
  double overlap_ms;
  double exposed_comm_ms;
  size_t buckets;
  size_t bytes_on_wire;
  double inline_comm_ms; /* DDP_COMM_INLINE: collectives run on the caller's thread */
} ddp_grad_sync_stats_t;

/* The defaults above. */
DDP_C_API int ddp_grad_sync_default_options(ddp_grad_sync_options_t* out);
/* Collective: checks every rank's options and parameters (a difference is
 * named), lays out the buckets. options may be NULL (defaults). */
DDP_C_API int ddp_grad_sync_create(const ddp_param_t* params, size_t n,
                                   const ddp_grad_sync_options_t* options, ddp_grad_sync** out);
/* Collective: parameter values (param_data[i], n of them) and `n_buffers`
 * buffers (each `buffer_counts[i]` elements of `buffer_dtypes[i]`) become
 * rank 0's. Buffers may be NULL when n_buffers is 0. */
DDP_C_API int ddp_grad_sync_prepare(ddp_grad_sync* gs, void* const* param_data, size_t n,
                                    void* const* buffers, const size_t* buffer_counts,
                                    const int* buffer_dtypes, size_t n_buffers);
/* *out = parameter `index`'s gradient inside its bucket. */
DDP_C_API int ddp_grad_sync_grad(ddp_grad_sync* gs, size_t index, void** out);
/* grad = src / world_size (set) or grad += src / world_size (add). */
DDP_C_API int ddp_grad_sync_set_grad(ddp_grad_sync* gs, size_t index, const void* src);
DDP_C_API int ddp_grad_sync_add_grad(ddp_grad_sync* gs, size_t index, const void* src);
DDP_C_API int ddp_grad_sync_zero_grad(ddp_grad_sync* gs);
DDP_C_API int ddp_grad_sync_begin_backward(ddp_grad_sync* gs);
/* Hands over this rank's gradient of parameter `index` by writing it:
 * write(block, user) stores (block->accumulate 0) or adds (1) block->scale
 * times the gradient at block->data, once per block (GradAverager::
 * contribute: one block of every row in GradSync's modes, blocks of rows of
 * the node's sum under DDP_COMM_SHARED), and the parameter is marked ready.
 * Fails for a parameter already handed over, when write() returns non-zero,
 * or when a block stays held by another rank past the group's timeout
 * (naming it). */
DDP_C_API int ddp_grad_sync_contribute(ddp_grad_sync* gs, size_t index, ddp_grad_block_writer write,
                                       void* user);
/* Fails (naming the parameter) when it was already marked in this iteration. */
DDP_C_API int ddp_grad_sync_mark_ready(ddp_grad_sync* gs, size_t index);
/* Collective (synced iterations): waits; gradients hold the mean over ranks.
 * Fails listing parameters never marked ready (unless find_unused_parameters). */
DDP_C_API int ddp_grad_sync_finish(ddp_grad_sync* gs);
/* ZeRO-style sharding (GradSync::set_needed_gradients): parameter i's
 * gradient elements [begins[i], ends[i]) are the ones this rank reads after
 * finish(); the rest may stay unreduced. n == 0 restores full all-reduces,
 * otherwise n == the number of parameters. Between iterations; every rank. */
DDP_C_API int ddp_grad_sync_set_needed_gradients(ddp_grad_sync* gs, const size_t* begins,
                                                 const size_t* ends, size_t n);
/* GradSync::set_first_bucket_bytes: the first bucket's cap (bytes > 0) at run
 * time; the layout is rebuilt when it changes (gradient values kept, views
 * MOVE: fetch them again with ddp_grad_sync_grad). Between iterations; every
 * rank with the same value. */
DDP_C_API int ddp_grad_sync_set_first_bucket_bytes(ddp_grad_sync* gs, size_t bytes);
/* *out = 0 at first, +1 at every layout change (the rebuild after the first
 * iteration, set_first_bucket_bytes). */
DDP_C_API int ddp_grad_sync_layout_version(ddp_grad_sync* gs, int* out);
/* Iterations begun between begin and end accumulate without communication. */
DDP_C_API int ddp_grad_sync_no_sync_begin(ddp_grad_sync* gs);
DDP_C_API int ddp_grad_sync_no_sync_end(ddp_grad_sync* gs);
/* The latest iteration's figures (last) and the means over synced ones (mean;
 * either may be NULL). */
DDP_C_API int ddp_grad_sync_stats(ddp_grad_sync* gs, ddp_grad_sync_stats_t* last,
                                  ddp_grad_sync_stats_t* mean);
/* Waits for collectives in flight and frees everything. NULL is fine. */
DDP_C_API int ddp_grad_sync_destroy(ddp_grad_sync* gs);

/* ---- Sharded parameters (ddp::ParamShards, see ddp/param_shards.h) ----
 * ZeRO stage 1 over the default group: the parameters live in one buffer
 * (with shm on one node, ONE copy that every rank of the node maps); each
 * rank runs the optimizer only on the elements it owns, then all_gather hands
 * every rank the others' updated elements:
 *   ddp_param_shards_create(params, n, &ps);                     (collective)
 *   copy the values into ddp_param_shards_data(ps, i) (when node-shared: on
 *   one rank, then ddp_barrier()) and compute with them there
 *   each step: ... ddp_grad_sync_finish(gs); update the elements
 *   ddp_param_shards_owned() names; ddp_param_shards_all_gather(ps); (collective)
 * The parameters' count and dtype are used (any DDP_* dtype); device and
 * requires_grad are not (host memory; frozen parameters are sharded too).
 * REQUIRES: ddp_init(). */
typedef struct ddp_param_shards ddp_param_shards;

/* Collective: every rank with the same parameters, at the same point. */
DDP_C_API int ddp_param_shards_create(const ddp_param_t* params, size_t n, ddp_param_shards** out);
/* *out = parameter `index`'s values (its count elements of its dtype), valid
 * until ddp_param_shards_destroy. */
DDP_C_API int ddp_param_shards_data(ddp_param_shards* ps, size_t index, void** out);
/* Elements [*begin, *end) of parameter `index` are this rank's to update
 * (possibly none: *begin == *end). */
DDP_C_API int ddp_param_shards_owned(ddp_param_shards* ps, size_t index, size_t* begin,
                                     size_t* end);
/* *out = 1 when the buffer is one copy shared by the node's ranks (then write
 * only owned elements between all_gathers), else 0. */
DDP_C_API int ddp_param_shards_node_shared(ddp_param_shards* ps, int* out);
/* Collective: every rank's owned elements of every parameter to every rank. */
DDP_C_API int ddp_param_shards_all_gather(ddp_param_shards* ps);
/* Collective: the same for other parameter-shaped buffers (an optimizer's
 * state, e.g. before rank 0 saves it): buffers[i] holds parameter i's count
 * elements of its dtype, or is NULL on every rank alike; n must be the number
 * of parameters. */
DDP_C_API int ddp_param_shards_all_gather_buffers(ddp_param_shards* ps, void* const* buffers,
                                                  size_t n);
/* Frees the handle (the node-shared buffer stays until the group goes). NULL
 * is fine. */
DDP_C_API int ddp_param_shards_destroy(ddp_param_shards* ps);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DDP_DDP_C_H_ */
