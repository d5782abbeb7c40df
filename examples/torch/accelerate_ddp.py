#!/usr/bin/env python3
"""A Hugging Face Accelerate program, launched by ddprun exactly as by torchrun.

    DDP_PYTHON=/opt/ddprun-torch/bin/python ddprun --nproc_per_node=2 examples/torch/accelerate_ddp.py
    torchrun --nproc_per_node=2 examples/torch/accelerate_ddp.py           # the same program

The training loop of Accelerate's quick tour: `Accelerator()`,
`accelerator.prepare(model, optimizer, dataloader)`, `accelerator.backward(loss)`.
Accelerate reads the launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT) and wraps the model in DistributedDataParallel;
`cpu=True` keeps it on the CPU (Gloo), as Accelerate's multi-CPU recipe does
(`accelerate launch --cpu`), also where a GPU is present. The data is a tiny
synthetic regression set; prepare() shards its batches across the processes.
At the end every process prints

    ACCELERATE num_processes=N process_index=I distributed_type=T sum=... abs_sum=...

with a checksum of the final weights, identical everywhere when the replicas
stayed in sync.
"""

import argparse

import torch
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16, help="per process")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="gloo", help='process group backend; "ddp": ddprun\'s (pip install ddprun)')
    return p.parse_args()


def synthetic_dataset(samples, seed):
    """y = tanh(x . w / 4) + noise, the same on every process (seeded generator)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 16, generator=g)
    w = torch.randn(16, 1, generator=g)
    y = torch.tanh(x @ w / 4) + 0.05 * torch.randn(samples, 1, generator=g)
    return TensorDataset(x, y)


def main():
    args = parse_args()
    torch.set_num_threads(1)
    if args.backend != "gloo":
        # Accelerate on the CPU refuses a backend name it does not know, but
        # takes a process group made before it as it is.
        torch.distributed.init_process_group(args.backend)
    accelerator = Accelerator(cpu=True)
    set_seed(args.seed)

    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    dataloader = DataLoader(synthetic_dataset(args.samples, args.seed), batch_size=args.batch_size, shuffle=True)
    model, optimizer, dataloader = accelerator.prepare(model, optimizer, dataloader)
    loss_fn = nn.MSELoss()

    for epoch in range(args.epochs):
        model.train()
        total = torch.zeros(2, dtype=torch.float64)  # loss sum, sample count on this process
        for x, y in dataloader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            accelerator.backward(loss)  # DDP all-reduces (averages) the gradients here
            optimizer.step()
            total += torch.tensor([loss.item() * len(x), len(x)], dtype=torch.float64)
        total = accelerator.reduce(total, reduction="sum")
        accelerator.print(f"epoch {epoch} loss {total[0].item() / total[1].item():.6f}")

    accelerator.wait_for_everyone()
    with torch.no_grad():
        params = [p.detach().double() for p in accelerator.unwrap_model(model).parameters()]
        total_sum = sum(p.sum().item() for p in params)
        abs_sum = sum(p.abs().sum().item() for p in params)
    print(
        f"ACCELERATE num_processes={accelerator.num_processes} process_index={accelerator.process_index} "
        f"distributed_type={accelerator.distributed_type} sum={total_sum:.17g} abs_sum={abs_sum:.17g}",
        flush=True,
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()
