#!/usr/bin/env python3
"""torch.distributed on the "ddp" backend against torch's Gloo, side by side.

    python3 bench/torch_backend_bench.py BUILD_DIR [--rounds 3] [--ranks 2]
    python3 bench/torch_backend_bench.py BUILD_DIR --hosts 2    (root: two test hosts)

Runs the same worker under ddprun once per backend, in turns (gloo, ddp,
gloo, ddp, ...), and prints per backend the median over rounds of:
  - all_reduce of float32 (sum) at 4 KiB, 1 MiB and 64 MiB: time and algbw;
  - barrier;
  - for ddp, the same 4 KiB all_reduce made straight on libddp's group from
    C++ (no c10d): the backend's own cost is the difference;
  - a DDP training step of a communication-bound model (an MLP of four
    1024x1024 layers, 16 MiB of gradients, batch 8): samples/s.
then the ratios. With --hosts 2 the job is two test hosts (network namespaces
joined by a bridge, 198.18.0.1-2, made and removed here), one rank each,
ddprun's static form on each: Gloo over TCP between them for both
backends. The interpreter is DDP_TORCH_PYTHON (default
/opt/ddprun-torch/bin/python); the package comes from BUILD_DIR/python.
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

SIZES = [(4 << 10, "4KiB", 4000), (1 << 20, "1MiB", 200), (64 << 20, "64MiB", 6)]


def timed(fn, iters, dist, torch):
    """Seconds per call, the slowest rank's, best of 5 trials."""
    best = float("inf")
    for _ in range(5):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        dt = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        best = min(best, dt.item())
    return best


def ddp_step_rate(backend, dist, torch):
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(4)]))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 1024), torch.randn(8, 1024)

    def step():
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    for _ in range(3):
        step()
    per_step = timed(step, 10, dist, torch)
    return 8 * dist.get_world_size() / per_step


def worker(backend):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    if backend == "ddp":
        import ddprun.torch  # noqa: F401
    dist.init_process_group(backend)
    out = {}
    for nbytes, label, iters in SIZES:
        x = torch.zeros(nbytes // 4)
        for _ in range(3):
            dist.all_reduce(x)
        out[f"all_reduce_{label}_us"] = timed(lambda: dist.all_reduce(x), iters, dist, torch) * 1e6
        if backend == "ddp" and label == "4KiB":
            pg = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
            pg._time_libddp_all_reduce(x, iters)  # warm-up
            out["libddp_all_reduce_4KiB_us"] = min(
                pg._time_libddp_all_reduce(x, iters) for _ in range(5)) * 1e6
            # c10d's share: the backend's own binding, without the dispatcher and Python layer.
            opts = dist.AllreduceOptions()
            opts.asyncOp = False
            out["backend_call_4KiB_us"] = timed(lambda: pg.allreduce([x], opts).wait(), iters,
                                                dist, torch) * 1e6
    out["barrier_us"] = timed(dist.barrier, 2000, dist, torch) * 1e6
    out["ddp_step_samples_per_s"] = ddp_step_rate(backend, dist, torch)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


def result_of(backend, outputs):
    for out in outputs:
        for line in out.stdout.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])
    raise SystemExit(f"{backend} run failed:\n" + "\n".join(o.stdout + o.stderr for o in outputs))


def job_env(build, python):
    return dict(os.environ, DDP_PYTHON=python, PYTHONPATH=os.path.join(build, "python"),
                OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="eth0")


def run_once(build, backend, ranks, python, hosts=None):
    ddprun = os.path.join(build, "launcher", "ddprun")
    tail = [__file__, "--worker", backend]
    if hosts is None:
        cmd = [ddprun, f"--nproc_per_node={ranks}", "--no_prefix"] + tail
        return result_of(backend, [subprocess.run(cmd, env=job_env(build, python),
                                                  capture_output=True, text=True, timeout=600)])
    procs = []
    for i, ns in enumerate(hosts):
        cmd = ["ip", "netns", "exec", ns, ddprun, "--nnodes=2", f"--node_rank={i}",
               "--master_addr=198.18.0.1", "--master_port=29500", "--nproc_per_node=1",
               "--no_prefix"] + tail
        procs.append(subprocess.Popen(cmd, env=job_env(build, python), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        outs.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return result_of(backend, outs)


class TestHosts:
    """Two network namespaces on a bridge (198.18.0.1 and .2), removed on exit."""

    def __init__(self):
        self.prefix = f"ddptb{os.getpid()}"
        self.hosts = [f"{self.prefix}-h{i}" for i in range(2)]

    def sh(self, *args):
        subprocess.run(args, check=True)

    def __enter__(self):
        sw = f"{self.prefix}-sw"
        self.sh("ip", "netns", "add", sw)
        self.sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        self.sh("ip", "-n", sw, "link", "set", "br0", "up")
        for i, ns in enumerate(self.hosts):
            self.sh("ip", "netns", "add", ns)
            self.sh("ip", "-n", sw, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0",
                    "netns", ns)
            self.sh("ip", "-n", sw, "link", "set", f"p{i}", "master", "br0", "up")
            self.sh("ip", "-n", ns, "addr", "add", f"198.18.0.{i + 1}/24", "dev", "eth0")
            self.sh("ip", "-n", ns, "link", "set", "eth0", "up")
            self.sh("ip", "-n", ns, "link", "set", "lo", "up")
        return self.hosts

    def __exit__(self, *exc):
        for ns in self.hosts + [f"{self.prefix}-sw"]:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
            for pid in pids.split():
                subprocess.run(["kill", "-KILL", pid], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build", nargs="?")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--hosts", type=int, choices=[1, 2], default=1)
    p.add_argument("--worker")
    a = p.parse_args()
    if a.worker:
        return worker(a.worker)
    python = os.environ.get("DDP_TORCH_PYTHON", "/opt/ddprun-torch/bin/python")
    runs = {"gloo": [], "ddp": []}
    with contextlib.ExitStack() as stack:
        hosts = stack.enter_context(TestHosts()) if a.hosts == 2 else None
        for i in range(a.rounds):
            for backend in ("gloo", "ddp"):
                runs[backend].append(run_once(a.build, backend, a.ranks, python, hosts))
                print(f"round {i + 1} {backend}: {json.dumps(runs[backend][-1])}", flush=True)
    med = {b: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for b, rs in runs.items()}
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    where = f"{a.ranks} ranks on one node" if a.hosts == 1 else "2 test hosts, one rank each"
    print(f"\n{where}, {os.cpu_count()} CPUs ({cpu}); medians of {a.rounds} rounds")
    print(f"{'':28} {'gloo':>12} {'ddp':>12} {'gloo/ddp':>9}")
    for nbytes, label, _ in SIZES:
        g, d = med["gloo"][f"all_reduce_{label}_us"], med["ddp"][f"all_reduce_{label}_us"]
        print(f"all_reduce {label:>6} (us)      {g:12.1f} {d:12.1f} {g / d:8.2f}x"
              f"   algbw {nbytes / g / 1e3:.2f} vs {nbytes / d / 1e3:.2f} GB/s")
    g, d = med["gloo"]["barrier_us"], med["ddp"]["barrier_us"]
    print(f"barrier (us)                 {g:12.1f} {d:12.1f} {g / d:8.2f}x")
    g, d = med["gloo"]["ddp_step_samples_per_s"], med["ddp"]["ddp_step_samples_per_s"]
    print(f"DDP step (samples/s)         {g:12.0f} {d:12.0f} {d / g:8.2f}x (ddp/gloo)")
    floor = med["ddp"]["libddp_all_reduce_4KiB_us"]
    call = med["ddp"]["backend_call_4KiB_us"]
    whole = med["ddp"]["all_reduce_4KiB_us"]
    print(f"at 4 KiB: dist.all_reduce {whole:.1f} us = libddp's call {floor:.1f} us"
          f" + the backend {call - floor:.1f} us (its binding's call {call:.1f} us)"
          f" + c10d's dispatcher and Python layer {whole - call:.1f} us")


if __name__ == "__main__":
    sys.exit(main())
