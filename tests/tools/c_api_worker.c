/* libddp's C API from a C program, run under ddprun. Prints "C OK rank=R"
 * when every check passed, else "C FAIL <why>" on stderr and exits 1. */

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ddp/ddp_c.h"

#define CHECK(cond, what)                                                                         \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      fprintf(stderr, "C FAIL %s (line %d; last error: %s)\n", what, __LINE__, ddp_last_error()); \
      return 1;                                                                                   \
    }                                                                                             \
  } while (0)

int main(void) {
  int rank, size, local, i;
  float f[4];
  int64_t big[2];
  double avg[1];
  int32_t b[3];

  /* The contract is readable before init. */
  rank = ddp_rank();
  size = ddp_world_size();
  local = ddp_local_rank();
  CHECK(rank >= 0 && size >= 1 && rank < size && local >= 0, "rank/size before init");
  CHECK(strcmp(ddp_last_error(), "") == 0, "no error yet");

  /* Collectives before init fail cleanly. */
  CHECK(ddp_barrier() == -1, "barrier before init fails");
  CHECK(strstr(ddp_last_error(), "init") != NULL, "the error says init is missing");

  CHECK(ddp_init(NULL) == 0, "ddp_init");
  CHECK(ddp_init(NULL) == 0, "second ddp_init keeps the group");
  CHECK(ddp_rank() == rank && ddp_world_size() == size && ddp_local_rank() == local,
        "rank/size after init");
  printf("C rank=%d size=%d local=%d\n", rank, size, local);

  for (i = 0; i < 4; ++i) f[i] = (float)(rank + 1) * (float)i;
  CHECK(ddp_all_reduce(f, 4, DDP_FLOAT32, DDP_SUM) == 0, "all_reduce float32 sum");
  for (i = 0; i < 4; ++i)
    CHECK(f[i] == (float)(size * (size + 1) / 2) * (float)i, "float32 sum value");

  big[0] = (int64_t)rank << 40;
  big[1] = -rank;
  CHECK(ddp_all_reduce(big, 2, DDP_INT64, DDP_MAX) == 0, "all_reduce int64 max");
  CHECK(big[0] == ((int64_t)(size - 1) << 40) && big[1] == 0, "int64 max value");

  avg[0] = rank;
  CHECK(ddp_all_reduce(avg, 1, DDP_FLOAT64, DDP_AVG) == 0, "all_reduce float64 avg");
  CHECK(avg[0] == (size - 1) / 2.0, "float64 avg value");

  for (i = 0; i < 3; ++i) b[i] = rank * 10 + i;
  CHECK(ddp_broadcast(b, 3, DDP_INT32, size - 1) == 0, "broadcast from the last rank");
  for (i = 0; i < 3; ++i) CHECK(b[i] == (size - 1) * 10 + i, "broadcast value");

  CHECK(ddp_barrier() == 0, "barrier");

  /* Bad arguments: -1 and a message naming what is wrong, no collective issued. */
  CHECK(ddp_all_reduce(f, 4, 42, DDP_SUM) == -1, "bad dtype fails");
  CHECK(strstr(ddp_last_error(), "dtype 42") != NULL, "the error names the dtype");
  printf("C bad dtype: %s\n", ddp_last_error());
  CHECK(ddp_all_reduce(f, 4, DDP_FLOAT32, 17) == -1, "bad op fails");
  CHECK(strstr(ddp_last_error(), "op 17") != NULL, "the error names the op");
  CHECK(ddp_broadcast(b, 3, DDP_INT32, size + 5) == -1, "bad root fails");
  CHECK(strstr(ddp_last_error(), "root") != NULL, "the error names the root");
  CHECK(ddp_all_reduce(NULL, 4, DDP_FLOAT32, DDP_SUM) == -1, "NULL data fails");

  /* The group still works after those errors. */
  avg[0] = 1.0;
  CHECK(ddp_all_reduce(avg, 1, DDP_FLOAT64, DDP_SUM) == 0 && avg[0] == size, "usable after errors");

  CHECK(ddp_shutdown() == 0, "shutdown");
  CHECK(ddp_shutdown() == 0, "shutdown is idempotent");
  CHECK(ddp_barrier() == -1, "barrier after shutdown fails");
  printf("C OK rank=%d\n", rank);
  return 0;
}
