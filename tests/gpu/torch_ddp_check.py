#!/usr/bin/env python3
"""PyTorch DistributedDataParallel under a torchrun-compatible launcher.

    ddprun   --nproc_per_node=1 tests/gpu/torch_ddp_check.py              # NCCL on cuda:LOCAL_RANK
    torchrun --nproc_per_node=1 tests/gpu/torch_ddp_check.py              # the same program
    ddprun   --nproc_per_node=2 tests/gpu/torch_ddp_check.py --backend gloo   # CPU variant

The process group comes from the environment (env://). Right after
init_process_group the program all-reduces one value and prints when that
finished (wall clock, seconds since the epoch), so the caller can time
launch-to-first-all-reduce:

    FIRST_ALLREDUCE rank=R wall=T
    FINAL rank=R world=W pid=P backend=B device=D loss=L

`loss` is the last step's loss averaged over the ranks; the data, the initial
weights and the order of the batches are fixed by --seed, so two launchers
running the same world size print the same loss.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="nccl", choices=["nccl", "gloo"],
                   help="nccl: model and data on cuda:LOCAL_RANK; gloo: on the CPU")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main():
    args = parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.backend == "nccl":
        if not torch.cuda.is_available():
            raise SystemExit("torch_ddp_check: --backend nccl needs CUDA, and torch sees no GPU")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)

    dist.init_process_group(args.backend)  # env://, as under torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    probe = torch.ones(1, device=device)
    dist.all_reduce(probe)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    first = time.time()
    if int(probe.item()) != world:
        raise SystemExit(f"torch_ddp_check: the first all-reduce gave {probe.item()}, expected {world}")
    print(f"FIRST_ALLREDUCE rank={rank} wall={first:.6f}", flush=True)

    # y = tanh(x . w / 4): the same data on every rank (seeded), each rank its own slice.
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.samples, 32, generator=g)
    w = torch.randn(32, 1, generator=g)
    y = torch.tanh(x @ w / 4)
    per_rank = args.samples // world
    x = x[rank * per_rank:(rank + 1) * per_rank].to(device)
    y = y[rank * per_rank:(rank + 1) * per_rank].to(device)

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.MSELoss()
    batches = per_rank // args.batch_size
    loss = torch.zeros((), device=device)
    for step in range(args.steps):
        b = step % batches
        xb = x[b * args.batch_size:(b + 1) * args.batch_size]
        yb = y[b * args.batch_size:(b + 1) * args.batch_size]
        optimizer.zero_grad()
        loss = loss_fn(ddp(xb), yb)
        loss.backward()  # DDP averages the gradients here (NCCL or Gloo)
        optimizer.step()
    last = loss.detach().clone()
    dist.all_reduce(last)
    print(f"FINAL rank={rank} world={world} pid={os.getpid()} backend={dist.get_backend()} "
          f"device={device} loss={last.item() / world:.8f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
