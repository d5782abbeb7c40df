"""libddp's C API from Python through ctypes, run under ddprun:

    ddprun --no_python --nproc_per_node=2 /usr/bin/python3 c_api_ctypes.py /path/to/libddp.so

Prints "PY OK rank=R" when every check passed; otherwise "PY FAIL <why>" on
stderr and exit code 1. Only the standard library is used.
"""

import ctypes
import sys

DDP_FLOAT32, DDP_FLOAT64, DDP_FLOAT16, DDP_BFLOAT16, DDP_INT32, DDP_INT64, DDP_UINT8 = range(7)
DDP_SUM, DDP_AVG, DDP_MIN, DDP_MAX, DDP_PRODUCT = range(5)


def load(path):
    lib = ctypes.CDLL(path)
    lib.ddp_init.argtypes = [ctypes.c_char_p]
    for name in ("ddp_rank", "ddp_world_size", "ddp_local_rank", "ddp_barrier", "ddp_shutdown"):
        getattr(lib, name).argtypes = []
    lib.ddp_all_reduce.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    lib.ddp_broadcast.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    lib.ddp_last_error.argtypes = []
    lib.ddp_last_error.restype = ctypes.c_char_p
    return lib


class Failed(Exception):
    pass


def main():
    if len(sys.argv) != 2:
        print("usage: c_api_ctypes.py LIBDDP_SO", file=sys.stderr)
        return 64
    lib = load(sys.argv[1])

    def check(cond, what):
        if not cond:
            raise Failed("%s (last error: %s)" % (what, lib.ddp_last_error().decode()))

    check(lib.ddp_init(b"gloo") == 0, "ddp_init")
    rank, size, local = lib.ddp_rank(), lib.ddp_world_size(), lib.ddp_local_rank()
    check(0 <= rank < size and local >= 0, "rank/size")
    print("PY rank=%d size=%d local=%d" % (rank, size, local), flush=True)

    data = (ctypes.c_float * 3)(rank + 1.0, 2.0, -float(rank))
    check(lib.ddp_all_reduce(data, 3, DDP_FLOAT32, DDP_SUM) == 0, "all_reduce float32 sum")
    check(list(data) == [size * (size + 1) / 2.0, 2.0 * size, -size * (size - 1) / 2.0], "sum values %s" % list(data))

    ints = (ctypes.c_int64 * 2)(rank, 100 - rank)
    check(lib.ddp_all_reduce(ints, 2, DDP_INT64, DDP_MIN) == 0, "all_reduce int64 min")
    check(list(ints) == [0, 100 - (size - 1)], "min values %s" % list(ints))

    mean = (ctypes.c_double * 1)(float(rank))
    check(lib.ddp_all_reduce(mean, 1, DDP_FLOAT64, DDP_AVG) == 0, "all_reduce float64 avg")
    check(mean[0] == (size - 1) / 2.0, "avg value %r" % mean[0])

    raw = (ctypes.c_uint8 * 4)(*[rank * 10 + i for i in range(4)])
    check(lib.ddp_broadcast(raw, 4, DDP_UINT8, 0) == 0, "broadcast uint8 from 0")
    check(list(raw) == [0, 1, 2, 3], "broadcast values %s" % list(raw))

    check(lib.ddp_barrier() == 0, "barrier")

    check(lib.ddp_all_reduce(data, 3, 99, DDP_SUM) == -1, "bad dtype returns -1")
    message = lib.ddp_last_error().decode()
    check("dtype 99" in message, "the error names the dtype: %r" % message)
    print("PY bad dtype: %s" % message, flush=True)

    check(lib.ddp_shutdown() == 0, "shutdown")
    print("PY OK rank=%d" % rank, flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failed as e:
        print("PY FAIL %s" % e, file=sys.stderr, flush=True)
        sys.exit(1)
