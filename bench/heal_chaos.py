#!/usr/bin/env python3
"""Live recovery under a fault schedule (docs/PERFORMANCE.md, "Live recovery").

Runs the reference trainer with 4 ranks on this machine three ways, one
after the other, each for --duration seconds:

  heal     ddprun --on_failure=heal, a random worker SIGKILLed every --kill-every s
  clean    the same, no faults
  restart  ddprun --on_failure=restart, checkpoints every 100 steps, --resume auto,
           the same kill schedule

and reports goodput (samples in committed steps per second) of each, and
for heal, per kill: the time from the kill to the survivors' first
committed step, and to the relaunched rank holding the live state again
(its "joined" line). --big adds one kill in a run whose parameters plus
optimizer state are about 1 GiB per rank, for the heal's bandwidth.

  python3 bench/heal_chaos.py BUILD_DIR [--duration 300] [--kill-every 30] [--big]
"""

import argparse
import atexit
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def children(pid):
    """The workers: ddprun's child processes but its orphan guard (ddprun-guard)."""
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    except OSError:
        return []
    workers = []
    for child in map(int, out.split()):
        try:
            with open("/proc/%d/comm" % child) as f:
                if f.read().strip() != "ddprun-guard":
                    workers.append(child)
        except OSError:
            pass  # gone meanwhile
    return workers


RUNNING = []  # the jobs to stop if this script ends early


def stop_running(*_):
    for run in RUNNING:
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGKILL)
    if _:
        sys.exit(1)


class Run:
    """One ddprun job whose output lines are timestamped as they arrive."""

    def __init__(self, argv, env):
        self.start = time.time()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=env, text=True, bufsize=1, start_new_session=True)
        self.lines = []  # (time, line)
        self.kills = []  # times
        RUNNING.append(self)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def kill_one(self):
        workers = children(self.proc.pid)
        if not workers:
            return
        victim = random.choice(workers)
        self.kills.append(time.time())
        os.kill(victim, signal.SIGKILL)

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.reader.join(timeout=5)


def drive(argv, env, duration, kill_every):
    run = Run(argv, env)
    next_kill = run.start + kill_every if kill_every > 0 else None
    end = run.start + duration
    while time.time() < end and run.proc.poll() is None:
        if next_kill is not None and time.time() >= next_kill:
            run.kill_one()
            next_kill += kill_every
        time.sleep(0.05)
    run.stop()
    return run


STEP = re.compile(r"\[rank 0\] step (\d+)(?:/\d+)? \| epoch \d+ \|(?: world \d+ \|)? (?:samples (\d+) \|)?")


def goodput(run, global_batch):
    """Samples in committed steps per second, at the last progress line."""
    last = None
    for t, line in run.lines:
        m = STEP.search(line)
        if m:
            samples = int(m.group(2)) if m.group(2) else int(m.group(1)) * global_batch
            last = (t, samples)
    if last is None:
        return 0.0
    return last[1] / (last[0] - run.start)


def after_kills(run, pattern):
    """For each kill, seconds until the first line matching `pattern` after it."""
    delays = []
    for k in run.kills:
        hits = [t for t, line in run.lines if t > k and re.search(pattern, line)]
        if hits:
            delays.append(hits[0] - k)
    return delays


def ms(values):
    if not values:
        return "n/a"
    return "median %.0f ms, max %.0f ms (%d kills)" % (statistics.median(values) * 1e3,
                                                       max(values) * 1e3, len(values))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build_dir")
    ap.add_argument("--duration", type=float, default=300)
    ap.add_argument("--kill-every", type=float, default=30)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--big", action="store_true")
    ap.add_argument("--only-big", action="store_true", help="skip the three goodput runs")
    args = ap.parse_args()

    ddprun = os.path.join(args.build_dir, "launcher", "ddprun")
    train = os.path.join(args.build_dir, "examples", "train")
    for path in (ddprun, train):
        if not os.access(path, os.X_OK):
            sys.exit("heal_chaos: %s is missing: build first" % path)
    env = dict(os.environ, DDP_TIMEOUT_S="60", OPENBLAS_NUM_THREADS="1")
    env.pop("DDP_BACKEND", None)
    batch = 32
    model = ["--hidden", str(args.hidden), "--layers", "3", "--batch_size", str(batch),
             "--steps", "100000000", "--log_every", "100"]
    launcher = [ddprun, "--nproc_per_node=%d" % args.nproc, "--max_restarts=1000"]
    ckpt = tempfile.mkdtemp(prefix="heal-chaos-")
    cpu = open("/proc/cpuinfo").read()
    cpu_model = re.search(r"model name\s*:\s*(.*)", cpu).group(1)
    print("heal_chaos: %d ranks, MLP hidden %d x 3, batch %d per rank, %.0f s per run, a kill "
          "every %.0f s; %s, %d CPUs" % (args.nproc, args.hidden, batch, args.duration,
                                         args.kill_every, cpu_model, os.cpu_count()))

    if not args.only_big:
        trio(args, launcher, train, model, env, batch, ckpt)
    if args.big or args.only_big:
        big_heal(launcher, train, env)


def trio(args, launcher, train, model, env, batch, ckpt):
    heal = drive(launcher + ["--on_failure=heal", train] + model, env, args.duration,
                 args.kill_every)
    clean = drive(launcher + ["--on_failure=heal", train] + model, env, args.duration, 0)
    restart = drive(launcher + ["--on_failure=restart", train] + model +
                    ["--checkpoint", os.path.join(ckpt, "ckpt"), "--checkpoint_every", "100",
                     "--resume", "auto"], env, args.duration, args.kill_every)

    g = {name: goodput(r, batch * args.nproc) for name, r in
         (("clean", clean), ("heal", heal), ("restart", restart))}
    print("| run | goodput (samples/s) | vs clean |")
    print("|---|---:|---:|")
    for name in ("clean", "heal", "restart"):
        print("| %s | %.0f | %.1f%% |" % (name, g[name], 100 * g[name] / max(g["clean"], 1e-9)))
    print("heal: kill -> survivors' first committed step: " +
          ms(after_kills(heal, r"heal: step \d+ committed")))
    print("heal: kill -> relaunched rank holds the live state (joined): " +
          ms(after_kills(heal, r"heal: joined epoch")))



def big_heal(launcher, train, env):
    if True:
        # About 1 GiB per rank: weights + SGD momentum of hidden 11585 x 2 layers.
        big = ["--hidden", "11585", "--layers", "2", "--batch_size", "8", "--input_dim", "64",
               "--steps", "100000000", "--log_every", "1"]
        run = Run(launcher + ["--on_failure=heal", train] + big, env)
        deadline = time.time() + 600
        while time.time() < deadline and not any("step 3" in l for _, l in run.lines):
            if run.proc.poll() is not None:
                sys.exit("heal_chaos: the 1 GiB run ended before step 3:\n" +
                         "\n".join(l for _, l in run.lines[-20:]))
            time.sleep(0.2)
        run.kill_one()
        while time.time() < deadline and not any("joined epoch" in l for t, l in run.lines
                                                 if t > run.kills[-1]):
            time.sleep(0.1)
        time.sleep(1)
        run.stop()
        for t, line in run.lines:
            if "heal:" in line and t > run.kills[-1]:
                print("big (1 GiB state), +%.0f ms: %s" % ((t - run.kills[-1]) * 1e3, line))
        print("big: kill -> relaunched rank holds the live state: " +
              ms(after_kills(run, r"heal: joined epoch")))


if __name__ == "__main__":
    atexit.register(stop_running)
    signal.signal(signal.SIGTERM, stop_running)
    signal.signal(signal.SIGINT, stop_running)
    sys.exit(main())
