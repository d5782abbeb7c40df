#!/usr/bin/env python3
"""A PyTorch Lightning DDP program, launched by ddprun exactly as by torchrun.

    DDP_PYTHON=/opt/ddprun-torch/bin/python ddprun --nproc_per_node=2 examples/torch/lightning_ddp.py
    torchrun --nproc_per_node=2 examples/torch/lightning_ddp.py           # the same program

    # two nodes, one process each (Lightning wants devices * num_nodes == WORLD_SIZE):
    ddprun --nnodes=2 --node_rank=K --master_addr=ADDR --master_port=29500 --nproc_per_node=1 \\
        examples/torch/lightning_ddp.py --devices 1 --num_nodes 2

As Lightning's docs run a Trainer under torchrun: `Trainer(accelerator="cpu",
strategy="ddp", devices=2)`. Lightning sees TORCHELASTIC_RUN_ID and the other
torchelastic variables, picks its TorchElasticEnvironment and starts no
process of its own; CPU, so the process group is Gloo. The data is a tiny
synthetic regression set, the same on every rank. At the end every rank prints

    LIGHTNING rank=R world=W pid=P ppid=PP env=CLASS sum=... abs_sum=...

its global rank, the world size, its pid and parent's pid (the launcher's, when
Lightning started nothing), the cluster environment class Lightning picked
and a checksum of the final weights, identical on every rank when the
replicas stayed in sync.
"""

import argparse
import os

import lightning as L
from lightning.pytorch.strategies import DDPStrategy
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=2, help="processes per node (torchrun's --nproc_per_node)")
    p.add_argument("--num_nodes", type=int, default=1)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="gloo", help='process group backend; "ddp": ddprun\'s (pip install ddprun)')
    return p.parse_args()


class LitRegressor(L.LightningModule):
    def __init__(self, lr=0.1):
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


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
    L.seed_everything(args.seed, verbose=False)
    model = LitRegressor()
    # Lightning adds a DistributedSampler to this loader under DDP.
    loader = DataLoader(synthetic_dataset(args.samples, args.seed), batch_size=args.batch_size, shuffle=True)
    trainer = L.Trainer(
        accelerator="cpu",
        strategy=DDPStrategy(process_group_backend=args.backend),
        devices=args.devices,
        num_nodes=args.num_nodes,
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader)

    with torch.no_grad():
        params = [p.detach().double() for p in model.parameters()]
        total_sum = sum(p.sum().item() for p in params)
        abs_sum = sum(p.abs().sum().item() for p in params)
    env = trainer.strategy.cluster_environment.__class__.__name__
    print(
        f"LIGHTNING rank={trainer.global_rank} world={trainer.world_size} pid={os.getpid()} ppid={os.getppid()} "
        f"env={env} sum={total_sum:.17g} abs_sum={abs_sum:.17g}",
        flush=True,
    )
    # As torch asks of every program (Lightning's Trainer leaves the group up):
    # without it, torch's Gloo can abort at interpreter exit ("terminate called
    # without an active exception") while its threads still hold tensors.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
