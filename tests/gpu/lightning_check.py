#!/usr/bin/env python3
"""Lightning's Trainer under a torchrun-compatible launcher.

    ddprun   --nproc_per_node=1 tests/gpu/lightning_check.py --accelerator gpu --devices 1
    ddprun   --nproc_per_node=2 tests/gpu/lightning_check.py --accelerator cpu --devices 2
    torchrun --nproc_per_node=2 tests/gpu/lightning_check.py --accelerator cpu --devices 2

Uses `lightning` or, failing that, `pytorch_lightning`; exits 3 (printing
LIGHTNING_MISSING) when neither can be imported. Under a launcher Lightning
must find torchelastic's environment (TorchElasticEnvironment) and start no
processes of its own: every rank the launcher started prints one line

    REPORT pid=P ppid=Q rank=R local_rank=L world=W env=CLASS external=0|1 strategy=CLASS package=NAME metric=M

where `metric` is the last epoch's mean training loss (synchronised over the
ranks). Data, weights and batch order are fixed by --seed.
"""

import argparse
import os
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning as L
    PACKAGE = "lightning"
except ImportError:
    try:
        import pytorch_lightning as L
        PACKAGE = "pytorch_lightning"
    except ImportError:
        print("LIGHTNING_MISSING neither 'lightning' nor 'pytorch_lightning' can be imported by "
              f"{sys.executable}", flush=True)
        sys.exit(3)


class Regression(L.LightningModule):
    def __init__(self, lr):
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
        self.loss_fn = nn.MSELoss()

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.loss_fn(self.net(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--accelerator", default="gpu", choices=["gpu", "cpu"])
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--strategy", default="ddp")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main():
    args = parse_args()
    if args.accelerator == "cpu":
        torch.set_num_threads(1)
    L.seed_everything(args.seed, workers=True)
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.samples, 16, generator=g)
    w = torch.randn(16, 1, generator=g)
    y = torch.tanh(x @ w / 4) + 0.05 * torch.randn(args.samples, 1, generator=g)
    # shuffle=False: Lightning puts a DistributedSampler in front of it (no shuffling either).
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=False)

    trainer = L.Trainer(accelerator=args.accelerator, devices=args.devices, strategy=args.strategy,
                        num_nodes=1, max_epochs=args.epochs, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Regression(args.lr), loader)

    env = getattr(trainer.strategy, "cluster_environment", None)
    metric = trainer.callback_metrics.get("train_loss")
    print(f"REPORT pid={os.getpid()} ppid={os.getppid()} rank={trainer.global_rank} "
          f"local_rank={trainer.local_rank} world={trainer.world_size} "
          f"env={type(env).__name__ if env is not None else 'none'} "
          f"external={int(bool(env is not None and env.creates_processes_externally))} "
          f"strategy={type(trainer.strategy).__name__} package={PACKAGE} "
          f"metric={float(metric) if metric is not None else float('nan'):.8f}", flush=True)


if __name__ == "__main__":
    main()
