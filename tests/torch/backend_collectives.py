"""Every collective of the "ddp" backend against the values torch computes
itself, for every dtype and op torch's Gloo takes. Run under a launcher
(ddprun or torchrun) with any number of ranks; prints one line per rank:
"COLLECTIVES OK rank=R checks=N transport=T", or raises naming the case.

  --backend NAME   the backend to check (default ddp; gloo for comparison)
  --init URL       init_method (default env://)
"""

import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist

DTYPES = [
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool,
]
OPS = ["SUM", "AVG", "MIN", "MAX", "PRODUCT", "BAND", "BOR", "BXOR"]


def rank_value(rank, n, dtype):
    """What rank `rank` contributes: distinct per rank and element, small enough not to overflow."""
    base = torch.arange(n, dtype=torch.int64) % 5 + rank + 1
    if dtype == torch.bool:
        return (base + rank) % 2 == 0
    return base.to(dtype)


def expected(op, world, n, dtype):
    stack = torch.stack([rank_value(r, n, dtype) for r in range(world)])
    if dtype == torch.bool:
        b = stack
        return {"SUM": b.any(0), "MAX": b.any(0), "BOR": b.any(0), "MIN": b.all(0),
                "PRODUCT": b.all(0), "BAND": b.all(0),
                "BXOR": b.to(torch.int64).sum(0) % 2 == 1}.get(op)
    if op == "SUM":
        return stack.sum(0, dtype=dtype)
    if op == "AVG":
        if dtype.is_floating_point:
            return (stack.to(torch.float64).sum(0) / world).to(dtype)
        return torch.div(stack.to(torch.int64).sum(0), world, rounding_mode="trunc").to(dtype)
    if op == "PRODUCT":
        return stack.prod(0, dtype=dtype)
    if op == "MIN":
        return stack.min(0).values
    if op == "MAX":
        return stack.max(0).values
    if dtype.is_floating_point:
        return None
    out = stack[0].clone()
    for row in stack[1:]:
        out = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or,
               "BXOR": torch.bitwise_xor}[op](out, row)
    return out


class Checks:
    def __init__(self):
        self.count = 0

    def equal(self, got, want, what):
        tol = 1e-2 if got.dtype in (torch.float16, torch.bfloat16) else 1e-6
        if got.dtype.is_floating_point:
            ok = torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)
        else:
            ok = torch.equal(got, want)
        if not ok:
            raise AssertionError(f"{what}: got {got.tolist()[:8]}, want {want.tolist()[:8]}")
        self.count += 1


def check_all_reduce(c, rank, world, backend):
    for dtype in DTYPES:
        for op in OPS:
            want = expected(op, world, 37, dtype)
            if want is None or (backend == "gloo" and op == "AVG"):
                continue
            t = rank_value(rank, 37, dtype)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            c.equal(t, want, f"all_reduce {op} {dtype}")
            # Async, with the future DDP's communication hooks chain on.
            t = rank_value(rank, 37, dtype)
            work = dist.all_reduce(t, op=getattr(dist.ReduceOp, op), async_op=True)
            c.equal(work.get_future().wait()[0], want, f"async all_reduce future {op} {dtype}")
            if backend == "gloo":
                continue  # torch's Gloo: non-contiguous float16 results differ past element 8
            # Non-contiguous, async.
            big = torch.zeros(37, 2, dtype=dtype)
            big[:, 0] = rank_value(rank, 37, dtype)
            work = dist.all_reduce(big[:, 0], op=getattr(dist.ReduceOp, op), async_op=True)
            work.wait()
            c.equal(big[:, 0], want, f"async non-contiguous all_reduce {op} {dtype}")
            c.equal(big[:, 1], torch.zeros(37, dtype=dtype), f"all_reduce {op} {dtype} left alone")


def check_reduce_family(c, rank, world, backend):
    for dtype in DTYPES:
        for op in ["SUM", "MAX"] + ([] if dtype.is_floating_point else ["BOR"]):
            want = expected(op, world, 11, dtype)
            t = rank_value(rank, 11, dtype)
            root = world - 1
            dist.reduce(t, dst=root, op=getattr(dist.ReduceOp, op))
            if rank == root:
                c.equal(t, want, f"reduce {op} {dtype}")
            elif backend != "gloo":  # torch's Gloo uses non-roots' tensors as scratch
                c.equal(t, rank_value(rank, 11, dtype), f"reduce {op} {dtype} leaves non-roots")
            # reduce_scatter_tensor: rank r gets slice r of the reduction.
            full = torch.cat([rank_value(rank, 11, dtype)] * world)
            out = torch.empty(11, dtype=dtype)
            dist.reduce_scatter_tensor(out, full, op=getattr(dist.ReduceOp, op))
            c.equal(out, want, f"reduce_scatter_tensor {op} {dtype}")
            outs = torch.empty(11, dtype=dtype)
            dist.reduce_scatter(outs, [rank_value(rank, 11, dtype) for _ in range(world)],
                                op=getattr(dist.ReduceOp, op))
            c.equal(outs, want, f"reduce_scatter {op} {dtype}")
    if backend != "gloo":
        full = torch.cat([rank_value(rank, 8, torch.float32)] * world)
        out = torch.empty(8)
        dist.reduce_scatter_tensor(out, full, op=dist.ReduceOp.AVG)
        c.equal(out, expected("AVG", world, 8, torch.float32), "reduce_scatter_tensor AVG (FSDP2)")


def check_dropped_inputs(c, rank, world):
    """Async calls whose input the caller drops at once (FSDP2 and the
    functional collectives do): the backend keeps it until the collective is done."""
    pending = []
    for _ in range(10):
        out = torch.empty(11)
        work = dist.reduce_scatter_tensor(
            out, torch.cat([rank_value(rank, 11, torch.float32)] * world), async_op=True)
        gathered = torch.empty(11 * world)
        work2 = dist.all_gather_into_tensor(gathered, rank_value(rank, 11, torch.float32) * 1,
                                            async_op=True)
        pending.append((out, work, gathered, work2))
        junk = [torch.full((11 * world,), -7.0) for _ in range(4)]  # reuses freed memory
        del junk
    for out, work, gathered, work2 in pending:
        work.wait()
        work2.wait()
        c.equal(out, expected("SUM", world, 11, torch.float32), "async reduce_scatter_tensor, input dropped")
        c.equal(gathered, torch.cat([rank_value(r, 11, torch.float32) for r in range(world)]),
                "async all_gather_into_tensor, input dropped")


def check_empty_and_coalesced(c, rank, world):
    """Empty tensors, sync and async, and the coalesced all_gather."""
    for async_op in (False, True):
        for fn in (lambda t: dist.all_reduce(t, async_op=async_op),
                   lambda t: dist.broadcast(t, src=0, async_op=async_op)):
            work = fn(torch.empty(0))
            if async_op:
                work.wait()
            c.count += 1
    ins = [rank_value(rank, 3, torch.float32), rank_value(rank, 5, torch.float32) * 2]
    outs = [[torch.empty(3), torch.empty(5)] for _ in range(world)]
    dist.all_gather_coalesced(outs, ins)
    for r in range(world):
        c.equal(outs[r][0], rank_value(r, 3, torch.float32), f"all_gather_coalesced from {r}")
        c.equal(outs[r][1], rank_value(r, 5, torch.float32) * 2, f"all_gather_coalesced from {r}")


def check_moves(c, rank, world):
    for dtype in DTYPES:
        mine = rank_value(rank, 13, dtype)
        every = [rank_value(r, 13, dtype) for r in range(world)]
        t = mine.clone()
        dist.broadcast(t, src=world - 1)
        c.equal(t, every[-1], f"broadcast {dtype}")
        outs = [torch.empty(13, dtype=dtype) for _ in range(world)]
        dist.all_gather(outs, mine)
        for r in range(world):
            c.equal(outs[r], every[r], f"all_gather {dtype} slice {r}")
        flat = torch.empty(13 * world, dtype=dtype)
        dist.all_gather_into_tensor(flat, mine)
        c.equal(flat, torch.cat(every), f"all_gather_into_tensor {dtype}")
        gathered = [torch.empty(13, dtype=dtype) for _ in range(world)] if rank == 0 else None
        dist.gather(mine, gathered, dst=0)
        if rank == 0:
            for r in range(world):
                c.equal(gathered[r], every[r], f"gather {dtype} slice {r}")
        got = torch.empty(13, dtype=dtype)
        dist.scatter(got, every if rank == 0 else None, src=0)
        c.equal(got, every[rank], f"scatter {dtype}")
        # all_to_all_single, even: rank r sends piece j (its value + j) to rank j.
        send = torch.cat([rank_value(rank, 3, dtype) for _ in range(world)])
        recv = torch.empty(3 * world, dtype=dtype)
        dist.all_to_all_single(recv, send)
        c.equal(recv, torch.cat([rank_value(r, 3, dtype) for r in range(world)]),
                f"all_to_all_single {dtype}")


def check_uneven_and_lists(c, rank, world, backend):
    # all_to_all_single with splits: rank r sends r+j+1 rows to rank j.
    in_splits = [rank + j + 1 for j in range(world)]
    out_splits = [r + rank + 1 for r in range(world)]
    send = torch.cat([torch.full((in_splits[j], 2), float(rank * 10 + j)) for j in range(world)])
    recv = torch.empty(sum(out_splits), 2)
    dist.all_to_all_single(recv, send, out_splits, in_splits)
    want = torch.cat([torch.full((out_splits[r], 2), float(r * 10 + rank)) for r in range(world)])
    c.equal(recv, want, "all_to_all_single uneven")
    # all_to_all of lists with uneven pieces (torch's Gloo takes even ones only).
    size = (lambda j: j + 1) if backend != "gloo" else (lambda j: 2)
    ins = [torch.full((size(j),), rank * 100 + j, dtype=torch.int64) for j in range(world)]
    outs = [torch.empty(size(rank), dtype=torch.int64) for _ in range(world)]
    dist.all_to_all(outs, ins)
    for r in range(world):
        c.equal(outs[r], torch.full((size(rank),), r * 100 + rank, dtype=torch.int64),
                f"all_to_all from {r}")
    objects = [None] * world
    dist.all_gather_object(objects, {"rank": rank, "text": "x" * rank})
    if objects != [{"rank": r, "text": "x" * r} for r in range(world)]:
        raise AssertionError(f"all_gather_object: {objects}")
    box = [{"from": 0}] if rank == 0 else [None]
    dist.broadcast_object_list(box, src=0)
    if box != [{"from": 0}]:
        raise AssertionError(f"broadcast_object_list: {box}")
    c.count += 2


def check_p2p_and_groups(c, rank, world):
    if world >= 2:
        if rank == 0:
            dist.send(torch.arange(5, dtype=torch.float32), dst=1, tag=3)
        elif rank == 1:
            t = torch.empty(5)
            dist.recv(t, src=0, tag=3)
            c.equal(t, torch.arange(5, dtype=torch.float32), "send/recv")
        # A ring of isend/irecv, every rank receiving first.
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        got = torch.empty(4, dtype=torch.int64)
        reqs = [dist.irecv(got, src=prv), dist.isend(torch.full((4,), rank), dst=nxt)]
        for r in reqs:
            r.wait()
        c.equal(got, torch.full((4,), prv), "isend/irecv ring")
    evens = list(range(0, world, 2))
    sub = dist.new_group(evens)
    if rank in evens:
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=sub)
        c.equal(t, torch.tensor([float(sum(evens))]), "new_group all_reduce")
    dist.barrier()
    c.count += 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="ddp")
    parser.add_argument("--init", default="env://")
    args = parser.parse_args()
    if args.backend == "ddp" and os.environ.get("DDP_TORCH_IMPORT", "1") == "1":
        import ddprun.torch  # noqa: F401  (else torch finds it by its entry point)
    numbering = {}
    if not args.init.startswith("env://"):  # file:// and tcp:// take them as arguments
        numbering = dict(rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    dist.init_process_group(args.backend, init_method=args.init,
                            timeout=datetime.timedelta(seconds=60), **numbering)
    rank, world = dist.get_rank(), dist.get_world_size()
    c = Checks()
    check_all_reduce(c, rank, world, args.backend)
    check_reduce_family(c, rank, world, args.backend)
    check_moves(c, rank, world)
    check_dropped_inputs(c, rank, world)
    check_empty_and_coalesced(c, rank, world)
    check_uneven_and_lists(c, rank, world, args.backend)
    check_p2p_and_groups(c, rank, world)
    transport = ""
    if args.backend == "ddp":
        import ddprun.torch
        transport = ddprun.torch.transport()
    # One write, newline included: under torchrun the ranks share one stdout
    # and nobody prefixes their lines, so print()'s separate write of the
    # newline (with PYTHONUNBUFFERED) could let the other rank's line in
    # between.
    sys.stdout.write(f"COLLECTIVES OK rank={rank} checks={c.count} transport={transport}\n")
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
