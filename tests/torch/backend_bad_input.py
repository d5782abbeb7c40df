"""What the "ddp" backend refuses, each with a Python exception naming the
thing that is wrong; the group goes on working after each. Prints
"BAD INPUT OK rank=R cases=N" per rank.

  --case world-size   init_process_group with a world size other than the launcher's
  --case late-peer    a subgroup one rank never joins: the error names it
"""

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist


def expect_error(kinds, words, fn):
    try:
        fn()
    except kinds as e:
        text = str(e)
        missing = [w for w in words if w not in text]
        if missing:
            raise AssertionError(f"error lacks {missing}: {text}") from e
        return 1
    raise AssertionError(f"no error for a call that should fail (wanted {words})")


def refused_calls(rank, world):
    cases = 0
    t = torch.ones(4)
    cases += expect_error((TypeError, RuntimeError), ["all_reduce", "BAND", "Float"],
                          lambda: dist.all_reduce(t, op=dist.ReduceOp.BAND))
    cases += expect_error((ValueError, RuntimeError), ["all_reduce", "PREMUL_SUM"],
                          lambda: dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0)))
    f8 = torch.ones(4).to(torch.float8_e4m3fn)
    cases += expect_error((TypeError, RuntimeError), ["all_reduce", "Float8_e4m3fn"],
                          lambda: dist.all_reduce(f8))
    cases += expect_error((ValueError, RuntimeError), ["all_gather_into_tensor", "elements"],
                          lambda: dist.all_gather_into_tensor(torch.empty(3), torch.ones(2)))
    cases += expect_error((ValueError, RuntimeError), ["send", "peer rank"],
                          lambda: dist.send(torch.ones(1), dst=world + 5))
    # Still usable after every refusal.
    t = torch.full((4,), float(rank))
    dist.all_reduce(t)
    assert t.tolist() == [float(sum(range(world)))] * 4, t
    return cases


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", default="calls")
    args = parser.parse_args()
    import ddprun.torch  # noqa: F401
    if args.case == "world-size":
        dist.init_process_group("ddp", rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]) + 1,
                                timeout=datetime.timedelta(seconds=10))
        return
    dist.init_process_group("ddp", timeout=datetime.timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.case == "late-peer":
        if rank == world - 1:
            time.sleep(30)  # never joins the subgroup in time
            return
        dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=3),
                       use_local_synchronization=True)
        return
    cases = refused_calls(rank, world)
    print(f"BAD INPUT OK rank={rank} cases={cases}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
