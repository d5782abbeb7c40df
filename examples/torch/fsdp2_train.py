#!/usr/bin/env python3
"""FSDP2 (torch.distributed.fsdp.fully_shard) on the CPU, launched by ddprun as by torchrun.

    ddprun --nproc_per_node=2 examples/torch/fsdp2_train.py [--backend ddp]

Each layer's parameters are sharded over the ranks; the forward all-gathers
them, the backward reduce-scatters the gradients (with ReduceOp.AVG where the
backend takes it). At the end every rank gathers the full weights and prints
`FSDP2 rank=R world_size=W sum=... abs_sum=...`, identical on every rank.
"""

import argparse
import gc

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="gloo", help='process group backend; "ddp": ddprun\'s (pip install ddprun)')
    return p.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    g = torch.Generator().manual_seed(args.seed + 1 + rank)  # each rank its own data
    w = torch.randn(16, 1, generator=torch.Generator().manual_seed(args.seed))
    for step in range(args.steps):
        x = torch.randn(args.batch_size, 16, generator=g)
        y = torch.tanh(x @ w / 4)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # FSDP2 reduce-scatters the gradients here
        optimizer.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)

    with torch.no_grad():
        full = [p.full_tensor().double() for p in model.parameters()]
        total_sum = sum(p.sum().item() for p in full)
        abs_sum = sum(p.abs().sum().item() for p in full)
    print(f"FSDP2 rank={rank} world_size={world} sum={total_sum:.17g} abs_sum={abs_sum:.17g}", flush=True)
    # The sharded modules hold the process group in reference cycles: free
    # them while it is still up (torch's Gloo may abort at interpreter exit
    # otherwise: docs/pytorch.md).
    del model, optimizer, full
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
