#!/usr/bin/env python3
"""The peer of bench/heal_chaos.py: the same MLP trained with torchft.

One replica group of one process, launched by torchrun with torchft's
environment (REPLICA_GROUP_ID, TORCHFT_LIGHTHOUSE), as torchft's CPU DDP
example runs: torchft's Manager and Optimizer wrapper over its Gloo process
group, with its default checkpoint transport for healing. The gradients
are all-reduced with Manager.allreduce, as one flat tensor after backward:
the call torchft's DistributedDataParallel makes from its communication
hook, which in torchft 0.2.0 fails an assertion on the survivors when a
peer dies mid all-reduce (torchft/ddp.py, `assert fut._fut`; torchft's
issues #295 and #304), so that every replica restarts from step 0. The model, batch and optimizer are the reference trainer's
(examples/train) with heal_chaos.py's flags: an MLP input 32, --layers
hidden layers of --hidden units, 10 classes, SGD lr 0.05 momentum 0.9,
--batch samples per replica per step, one CPU thread. The data is a fixed
synthetic set drawn from a seed.

Every --log-every committed steps it prints

  torchft-peer: step N | samples S

where S is torchft's count of batches committed over all replicas (kept in
its state dict, so a healed replica carries it on) times --batch: the
samples in committed steps so far.
"""

import argparse
import os
import sys
from datetime import timedelta

import torch
from torch import nn

from torchft import Manager, Optimizer, ProcessGroupGloo


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dataset-size", type=int, default=8192)
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--steps", type=int, default=10**9)
    ap.add_argument("--hostname", default=None,
                    help="the address peers reach this replica's manager at (a test host's)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    # The same float mode as ddprun's reference trainer (denormals flushed to zero).
    torch.set_flush_denormal(True)
    replica = int(os.environ.get("REPLICA_GROUP_ID", "0"))

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.dataset_size, 32, generator=gen)
    y = torch.randint(0, 10, (args.dataset_size,), generator=gen)

    dims = [32] + [args.hidden] * args.layers + [10]
    layers = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i + 2 < len(dims):
            layers.append(nn.ReLU())
    torch.manual_seed(0)
    model = nn.Sequential(*layers)

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])

    def state_dict():
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=5)), min_replica_size=1,
                      load_state_dict=load_state_dict, state_dict=state_dict,
                      replica_id="heal_chaos_%d" % replica, timeout=timedelta(seconds=30),
                      **({"hostname": args.hostname} if args.hostname else {}))
    optimizer = Optimizer(manager, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    loss_fn = nn.CrossEntropyLoss()

    batch = 0
    while manager.current_step() < args.steps:
        first = (batch * args.batch * 4 + replica * args.batch) % (args.dataset_size - args.batch)
        batch += 1
        optimizer.zero_grad()  # starts the quorum
        loss = loss_fn(model(x[first:first + args.batch]), y[first:first + args.batch])
        loss.backward()
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        manager.allreduce(flat).wait()  # the mean over the step's replicas; errors are kept
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        optimizer.step()  # applies them only when the step committed everywhere
        step = manager.current_step()
        if step % args.log_every == 0 and manager.is_participating():
            print("torchft-peer: step %d | samples %d" % (step,
                                                          manager.batches_committed() * args.batch),
                  flush=True)


if __name__ == "__main__":
    sys.exit(main())
