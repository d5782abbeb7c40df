#!/usr/bin/env python3
"""A plain PyTorch DDP program, launched by ddprun exactly as by torchrun.

    DDP_PYTHON=/usr/bin/python3 ddprun --nproc_per_node=2 examples/torch/train_ddp.py
    torchrun --nproc_per_node=2 examples/torch/train_ddp.py      # the same program

Nothing here knows about ddprun: the process group comes from the environment
(env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), the data is split by
torch's DistributedSampler, gradients are averaged by DistributedDataParallel.
Rank 0 logs the loss; at the end every rank prints
`FINAL_WEIGHTS rank=R sum=... abs_sum=...`, identical on every rank when the
replicas stayed in sync. `--crash-rank R` makes rank R raise during training,
to see how the launcher reports a failed worker.
"""

import argparse
import gc

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="gloo", help='"ddp": ddprun\'s c10d backend (pip install ddprun)')
    p.add_argument("--crash-rank", type=int, default=-1, help="this rank raises during the first epoch")
    return p.parse_args()


def synthetic_dataset(samples, seed):
    """y = tanh(x . w / 4) + noise, the same on every rank (seeded generator)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 16, generator=g)
    w = torch.randn(16, 1, generator=g)
    y = torch.tanh(x @ w / 4) + 0.05 * torch.randn(samples, 1, generator=g)
    return TensorDataset(x, y)


def main():
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)  # env://, as under torchrun
    rank, world = dist.get_rank(), dist.get_world_size()

    dataset = synthetic_dataset(args.samples, args.seed)
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(args.seed)  # DDP broadcasts rank 0's weights anyway
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.MSELoss()

    if rank == 0:
        print(f"training on {world} rank(s): {len(dataset)} samples, {len(loader)} steps/epoch/rank", flush=True)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2, dtype=torch.float64)  # loss sum, sample count
        for step, (x, y) in enumerate(loader):
            if rank == args.crash_rank and step == 1:
                raise RuntimeError(f"deliberate failure on rank {rank}")
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()  # DDP all-reduces (averages) the gradients here
            optimizer.step()
            total += torch.tensor([loss.item() * len(x), len(x)], dtype=torch.float64)
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch} loss {total[0].item() / total[1].item():.6f}", flush=True)

    with torch.no_grad():
        params = [p.detach().double() for p in model.parameters()]
        total_sum = sum(p.sum().item() for p in params)
        abs_sum = sum(p.abs().sum().item() for p in params)
    print(f"FINAL_WEIGHTS rank={rank} sum={total_sum:.17g} abs_sum={abs_sum:.17g}", flush=True)
    # DDP holds the process group: drop it first, so that destroy_process_group
    # ends Gloo's threads while `total` is still referenced here. Otherwise a
    # Gloo thread descheduled on a busy machine may release the last
    # all_reduce's tensor during interpreter shutdown, which aborts the process
    # ("terminate called without an active exception").
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
