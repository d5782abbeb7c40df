#!/usr/bin/env python3
"""torch.distributed's all_reduce timed as bench/allreduce_bench times libddp's.

    ddprun --nproc_per_node=N tests/gpu/torch_allreduce_bench.py [--backend nccl] [--max-bytes BYTES]

The peer of `allreduce_bench` on the same GPUs: float32 sum, in place, on a
buffer of the rank's device (CUDA device LOCAL_RANK with nccl), sizes 8 B to
--max-bytes doubling; per size a warm-up of min(iters, 5) calls, then --trials
trials of `iters` calls (allreduce_bench's counts: 200 up to 64 KiB, 50 up
to 1 MiB, 8 up to 16 MiB, 3 above), each trial ended by
torch.cuda.synchronize(), the slowest rank's time per call counting, the
median over trials. Prints allreduce_bench's columns:

    size(B) time(us) algbw(GB/s) busbw(GB/s) algorithm (always "torch")
"""

import argparse
import os
import time

import torch
import torch.distributed as dist


def iterations_for(size):
    if size <= 64 << 10:
        return 200
    if size <= 1 << 20:
        return 50
    if size <= 16 << 20:
        return 8
    return 3


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    p.add_argument("--min-bytes", type=int, default=8)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--trials", type=int, default=5)
    args = p.parse_args()
    if args.min_bytes < 4 or args.max_bytes < args.min_bytes or args.trials < 1:
        p.error("need 4 <= --min-bytes <= --max-bytes and --trials >= 1")
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(args.backend)
    n = dist.get_world_size()
    rank = dist.get_rank()
    buffer = torch.ones(args.max_bytes // 4, dtype=torch.float32, device=device)

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    if rank == 0:
        print(f"# torch {torch.__version__} all_reduce float32 sum, backend {args.backend}, "
              f"{n} ranks, {device.type} buffers, median of {args.trials} trials", flush=True)
        print(f"{'size(B)':>12} {'time(us)':>12} {'algbw(GB/s)':>10} {'busbw(GB/s)':>10}  algorithm")
    factor = 2.0 * (n - 1) / n
    size = args.min_bytes
    while size <= args.max_bytes:
        view = buffer[: size // 4]
        iters = iterations_for(size)
        for _ in range(min(iters, 5)):
            dist.all_reduce(view)
        synchronize()
        times = []
        for _ in range(args.trials):
            dist.barrier()
            synchronize()
            start = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(view)
            synchronize()
            per_call = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64,
                                    device=device)
            dist.all_reduce(per_call, op=dist.ReduceOp.MAX)
            times.append(per_call.item())
        times.sort()
        t = times[len(times) // 2]
        if rank == 0:
            algbw = size / t / 1e9
            print(f"{size:12d} {t * 1e6:12.1f} {algbw:10.3f} {algbw * factor:10.3f}  torch",
                  flush=True)
        size *= 2
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
