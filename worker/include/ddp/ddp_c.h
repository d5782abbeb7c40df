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
 * "gloo", "nccl", "local", or NULL/"" for the default (DDP_BACKEND, else nccl
 * when a GPU is visible, else gloo). Calling it again returns 0 and keeps the
 * existing group. */
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

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DDP_DDP_C_H_ */
