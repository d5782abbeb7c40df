"""Rank 1 sleeps before its fourth all_reduce on the "ddp" backend: ddprun
--hang_timeout names it, with the rank waiting for it in that collective."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("ddp")
t = torch.ones(4)
for step in range(4):
    if step == 3 and dist.get_rank() == 1:
        print("rank 1 sleeps before all_reduce #4", flush=True)
        time.sleep(120)
    dist.all_reduce(t)
print("not reached", flush=True)
