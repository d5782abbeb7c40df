#!/usr/bin/env python3
"""A DeepSpeed program, launched by ddprun exactly as by torchrun.

    DDP_PYTHON=/opt/ddprun-torch/bin/python ddprun --nproc_per_node=2 examples/torch/deepspeed_ddp.py
    torchrun --nproc_per_node=2 examples/torch/deepspeed_ddp.py           # the same program

DeepSpeed's getting-started loop: `deepspeed.init_distributed()`,
`deepspeed.initialize(model=..., optimizer=..., config=...)`,
`engine.backward(loss)`, `engine.step()`. DeepSpeed reads the launcher's
environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) as it
does under torchrun; on a machine without a GPU it runs on its CPU
accelerator over Gloo (`DS_ACCELERATOR=cpu`, set below when unset). ZeRO
stage 1 (`--zero-stage`) shards the optimizer state across the processes;
the optimizer is plain torch SGD, so no DeepSpeed op is compiled. At the end
every process prints

    DEEPSPEED world_size=N rank=I zero_stage=S sum=... abs_sum=...

with a checksum of the final weights, identical everywhere when the
replicas stayed in sync.
"""

import argparse
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=16, help="per process")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--zero-stage", type=int, default=1, choices=[0, 1, 2])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="gloo", help='process group backend; "ddp": ddprun\'s (pip install ddprun)')
    return p.parse_args()


def batch(step, rank, batch_size, seed):
    """This rank's slice of step `step`'s global batch: y = tanh(x . w / 4)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(16, 1, generator=g)
    g.manual_seed(seed * 1000003 + step * 101 + rank + 1)
    x = torch.randn(batch_size, 16, generator=g)
    return x, torch.tanh(x @ w / 4)


def main():
    args = parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    deepspeed.init_distributed(dist_backend=args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    config = {
        "train_micro_batch_size_per_gpu": args.batch_size,
        "gradient_accumulation_steps": 1,
        "train_batch_size": args.batch_size * world,
        "zero_optimization": {"stage": args.zero_stage},
        "zero_allow_untested_optimizer": True,  # torch SGD under ZeRO
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    loss_fn = nn.MSELoss()
    for step in range(args.steps):
        x, y = batch(step, rank, args.batch_size, args.seed)
        loss = loss_fn(engine(x), y)
        engine.backward(loss)  # gradients averaged across the processes
        engine.step()
        if step % 10 == 0 and rank == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)

    with torch.no_grad():
        params = [p.detach().double() for p in engine.module.parameters()]
        total_sum = sum(p.sum().item() for p in params)
        abs_sum = sum(p.abs().sum().item() for p in params)
    print(
        f"DEEPSPEED world_size={world} rank={rank} zero_stage={args.zero_stage} "
        f"sum={total_sum:.17g} abs_sum={abs_sum:.17g}",
        flush=True,
    )
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # torch's Gloo thread can abort a process at interpreter exit


if __name__ == "__main__":
    main()
