#!/usr/bin/env python3
"""The reference trainer's model in PyTorch eager mode, for a throughput baseline.

    python3 tests/gpu/eager_mlp_bench.py --hidden 1024 --layers 4 --batch-size 256 --steps 300

Same shape as `train` (examples/train): input_dim -> `layers` hidden
layers of `hidden` (ReLU) -> output_dim, cross-entropy over output_dim classes,
SGD with momentum 0.9. One process, no process group, the whole synthetic
dataset already on the device (so this is eager PyTorch's best case: no
host-to-device copies per step). The first `--warmup` steps are not timed.
Prints

    EAGER device=D samples_per_s=S steps=N batch=B params=P final_loss=L
"""

import argparse
import time

import torch
import torch.nn as nn


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--input-dim", type=int, default=32)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--output-dim", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--dataset-size", type=int, default=8192)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main():
    args = parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    dims = [args.input_dim] + [args.hidden] * args.layers + [args.output_dim]
    layers = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i + 2 < len(dims):
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers).to(device)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(args.dataset_size, args.input_dim, device=device)
    y = torch.randint(0, args.output_dim, (args.dataset_size,), device=device)
    batches = args.dataset_size // args.batch_size

    def step(i):
        b = i % batches
        xb = x[b * args.batch_size:(b + 1) * args.batch_size]
        yb = y[b * args.batch_size:(b + 1) * args.batch_size]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        optimizer.step()
        return loss

    for i in range(args.warmup):
        step(i)
    sync(device)
    start = time.perf_counter()
    loss = None
    for i in range(args.steps):
        loss = step(args.warmup + i)
    sync(device)
    seconds = time.perf_counter() - start
    print(f"EAGER device={device} samples_per_s={args.steps * args.batch_size / seconds:.0f} "
          f"steps={args.steps} batch={args.batch_size} params={params} "
          f"final_loss={loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
