#!/usr/bin/env python3
"""Live recovery under a fault schedule (docs/PERFORMANCE.md, "Live recovery").

Runs the reference trainer with 4 ranks on this machine up to five ways
(--runs), one after the other, each for --duration seconds (--rounds times, in rotating
order, for medians):

  heal     ddprun --on_failure=heal, a random worker SIGKILLed every --kill-every s
  clean    the same, no faults
  restart  ddprun --on_failure=restart, checkpoints every 100 steps, --resume auto,
           the same kill schedule
  torchft  the peer: the same model with torchft (bench/torchft_peer.py), one
           replica group of one process per rank, each under torchrun
           --max_restarts, a lighthouse, the same kill schedule; run when
           torchft imports in --torch-env (default $DDP_TORCH_ENV or
           /opt/ddprun-torch, where scripts/install-torch-env.sh puts it)
  torchft-clean  the same, no faults
  plain    ddprun --on_failure=restart, no faults (not in the default --runs:
           with --train-args=--shard_optimizer, what healing costs a sharded
           optimizer without faults, beside clean)

and reports goodput (samples in committed steps per second) of each, and
for heal, per kill: the time from the kill to the survivors' first
committed step, and to the relaunched rank holding the live state again
(its "joined" line). --big adds a run whose parameters plus optimizer
state are about 1 GiB per rank, killed --big-kills times, for the heal's
bandwidth.
--hosts 2 (root) runs the ranks on two test hosts (network namespaces on a
bridge, 198.18.0.1-2) with one ddprun each, the rendezvous on the first.

  python3 bench/heal_chaos.py BUILD_DIR [--duration 300] [--kill-every 30] [--rounds 1] [--hosts 1|2] [--big]
"""

import argparse
import atexit
import os
import random
import re
import shutil
import shlex
import signal
import socket
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
NAMESPACES = []  # the test hosts (--hosts 2), removed at exit


def stop_running(*_):
    for run in RUNNING:
        for proc in run.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    for ns in NAMESPACES:
        subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
        shutil.rmtree("/etc/netns/" + ns, ignore_errors=True)
    if _:
        sys.exit(1)


def make_hosts(n):
    """n network namespaces on one bridge, 198.18.0.1.. (RFC 2544's benchmarking range)."""
    prefix = "ddpch%d" % os.getpid()
    switch = prefix + "-sw"
    NAMESPACES.append(switch)
    run = lambda *cmd: subprocess.run(cmd, check=True)
    run("ip", "netns", "add", switch)
    run("ip", "-n", switch, "link", "add", "br0", "type", "bridge")
    run("ip", "-n", switch, "link", "set", "br0", "up")
    hosts = []
    for i in range(n):
        ns = "%s-h%d" % (prefix, i)
        NAMESPACES.append(ns)
        run("ip", "netns", "add", ns)
        run("ip", "-n", switch, "link", "add", "p%d" % i, "type", "veth", "peer", "name", "eth0",
            "netns", ns)
        run("ip", "-n", switch, "link", "set", "p%d" % i, "master", "br0", "up")
        run("ip", "-n", ns, "addr", "add", "198.18.0.%d/24" % (i + 1), "dev", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "up")
        run("ip", "-n", ns, "link", "set", "lo", "up")
        hosts.append(ns)
    # Each host resolves every host's name (its namespace's name) as a real one
    # would: ip netns exec bind-mounts /etc/netns/NS/hosts over /etc/hosts.
    names = "127.0.0.1 localhost\n" + "".join(
        "198.18.0.%d %s\n" % (i + 1, ns) for i, ns in enumerate(hosts))
    for ns in hosts:
        os.makedirs("/etc/netns/" + ns, exist_ok=True)
        with open("/etc/netns/%s/hosts" % ns, "w") as f:
            f.write(names)
    return hosts


class Run:
    """One ddprun job (one ddprun per host) whose output lines are timestamped as they arrive."""

    def __init__(self, argvs, env):
        self.start = time.time()
        self.procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       env=env, text=True, bufsize=1, start_new_session=True)
                      for argv in argvs]
        self.proc = self.procs[0]
        self.lines = []  # (time, line)
        self.kills = []  # times
        RUNNING.append(self)
        self.readers = [threading.Thread(target=self._read, args=(p,), daemon=True)
                        for p in self.procs]
        for reader in self.readers:
            reader.start()

    def _read(self, proc):
        for line in proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def running(self):
        return all(p.poll() is None for p in self.procs)

    def kill_one(self):
        workers = [w for p in self.procs for w in children(p.pid)]
        if not workers:
            return
        victim = random.choice(workers)
        self.kills.append(time.time())
        os.kill(victim, signal.SIGKILL)

    def stop(self):
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for reader in self.readers:
            reader.join(timeout=5)


def drive(argvs, env, duration, kill_every):
    run = Run(argvs, env)
    next_kill = run.start + kill_every if kill_every > 0 else None
    end = run.start + duration
    while time.time() < end and run.running():
        if next_kill is not None and time.time() >= next_kill:
            run.kill_one()
            next_kill += kill_every
        time.sleep(0.05)
    run.stop()
    return run


STEP = re.compile(r"\[rank 0\] step (\d+)(?:/\d+)? \| epoch \d+ \|(?: world \d+ \|)? (?:samples (\d+) \|)?")


def goodput(run, global_batch):
    """Samples in committed steps per second, at the last progress line."""
    points = committed_samples(run, global_batch)
    return points[-1][1] / points[-1][0] if points and points[-1][0] > 0 else 0.0


def committed_samples(run, global_batch):
    """Rank 0's progress lines: (seconds since the run's start, samples committed)."""
    points = []
    for t, line in run.lines:
        m = STEP.search(line)
        if m:
            points.append((t - run.start,
                           int(m.group(2)) if m.group(2) else int(m.group(1)) * global_batch))
    return points


def progress_lost(points, at, window):
    """Seconds of progress lost in `window` s after `at`, against the rate of the `window` s
    before it (from the run's own lines: drift between runs does not enter); None when the
    run does not cover both windows."""
    def samples_at(t):
        for (t0, s0), (t1, s1) in zip(points, points[1:]):
            if t0 <= t <= t1:
                return s0 + (s1 - s0) * (t - t0) / (t1 - t0) if t1 > t0 else s0
        return None
    before, now, after = samples_at(at - window), samples_at(at), samples_at(at + window)
    if None in (before, now, after) or now <= before:
        return None
    return window - (after - now) / ((now - before) / window)


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
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat the runs, in rotating order; goodput is the median")
    ap.add_argument("--hosts", type=int, default=1, choices=(1, 2),
                    help="2: two network-namespace test hosts of --nproc/2 ranks each (root)")
    ap.add_argument("--big", action="store_true")
    ap.add_argument("--only-big", action="store_true", help="skip the goodput runs")
    ap.add_argument("--big-kills", type=int, default=3, help="kills of the 1 GiB run")
    ap.add_argument("--runs", default="heal,clean,restart,torchft,torchft-clean",
                    help="which runs, comma-separated")
    ap.add_argument("--train-args", default="",
                    help="more flags for the reference trainer in ddprun's runs, given as "
                    "--train-args='--shard_optimizer --optimizer adam'")
    ap.add_argument("--log", help="a directory: each run's output goes to ROUND-NAME.log there")
    ap.add_argument("--torch-env", default=os.environ.get("DDP_TORCH_ENV", "/opt/ddprun-torch"),
                    help="the Python environment holding torch and torchft, for the peer run")
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
             "--steps", "100000000", "--log_every", "100"] + shlex.split(args.train_args)
    # One ddprun per host: its command line before --on_failure and the program.
    hosts = [None]  # where each ddprun runs: this host, or the namespaces of --hosts 2
    if args.hosts == 1:
        launcher = [[ddprun, "--nproc_per_node=%d" % args.nproc, "--max_restarts=1000"]]
    else:
        if os.geteuid() != 0:
            sys.exit("heal_chaos: --hosts needs root (network namespaces)")
        if args.nproc % args.hosts:
            sys.exit("heal_chaos: --nproc must be a multiple of --hosts")
        hosts = make_hosts(args.hosts)
        launcher = [["ip", "netns", "exec", ns, ddprun, "--nnodes=%d" % args.hosts,
                     "--nproc_per_node=%d" % (args.nproc // args.hosts), "--max_restarts=1000",
                     "--rdzv_backend=c10d", "--rdzv_endpoint=198.18.0.1:29400",
                     "--rdzv_id=heal-chaos",
                     "--rdzv_conf=heartbeat_interval=0.2,heartbeat_timeout=2,join_timeout=30"]
                    for ns in hosts]
    ckpt = tempfile.mkdtemp(prefix="heal-chaos-")
    cpu = open("/proc/cpuinfo").read()
    cpu_model = re.search(r"model name\s*:\s*(.*)", cpu).group(1)
    print("heal_chaos: %d ranks on %d host(s), MLP hidden %d x 3, batch %d per rank, %.0f s per "
          "run, a kill every %.0f s; %s, %d CPUs" % (args.nproc, args.hosts, args.hidden, batch,
                                                     args.duration, args.kill_every, cpu_model,
                                                     os.cpu_count()))
    if args.train_args:
        print("heal_chaos: the trainer also gets %s" % args.train_args)

    if not args.only_big:
        peer = torchft_peer(args, hosts, batch)
        trio(args, launcher, train, model, env, batch, ckpt, peer)
    if args.big or args.only_big:
        big_heal(launcher, train, env, args.big_kills, shlex.split(args.train_args), args.log)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchft_peer(args, hosts, batch):
    """A function making the torchft run's command lines (fresh ports each run), or None."""
    python = os.path.join(args.torch_env, "bin", "python")
    probe = subprocess.run([python, "-c", "import torchft"], capture_output=True, text=True) \
        if os.access(python, os.X_OK) else None
    if probe is None or probe.returncode != 0:
        print("torchft: not run: torchft does not import in %s%s" %
              (args.torch_env, (": " + probe.stderr.strip().splitlines()[-1])
               if probe is not None and probe.stderr.strip() else ""))
        return None
    version = subprocess.run([python, "-c", "import importlib.metadata as m; "
                              "print(m.version('torchft'), m.version('torch'))"],
                             capture_output=True, text=True).stdout.split()
    print("torchft: the peer, torchft %s on torch %s (%s)" % (version[0], version[1], python))
    peer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchft_peer.py")
    per_host = args.nproc // len(hosts)

    def argvs():
        # On a test host, in a UTS namespace of its own named as the host:
        # torchft tells its peers where to fetch a checkpoint by hostname.
        where = lambda ns: ["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c",
                            'hostname "$0" && exec "$@"', ns] if ns else []
        address = lambda i: "198.18.0.%d" % (i + 1) if hosts[i] else "127.0.0.1"
        lighthouse = "%s:%d" % (address(0), free_port())
        # torchft's README's lighthouse settings.
        out = [["env", "RUST_LOG=warn"] + where(hosts[0]) +
               [os.path.join(args.torch_env, "bin", "torchft_lighthouse"), "--min_replicas", "1",
                "--quorum_tick_ms", "100", "--join_timeout_ms", "10000", "--bind", lighthouse]]
        for replica in range(args.nproc):
            h = replica // per_host
            # RUST_LOG=warn: torchft's manager and lighthouse log every step at
            # INFO otherwise (megabytes a minute); ddprun logs no step either.
            # GLOO_SOCKET_IFNAME: a test host's interface, not the loopback its
            # hostname resolves to.
            env = ["env", "RUST_LOG=warn", "REPLICA_GROUP_ID=%d" % replica,
                   "TORCHFT_LIGHTHOUSE=http://" + lighthouse]
            if hosts[h]:
                env.append("GLOO_SOCKET_IFNAME=eth0")
            torchrun = [os.path.join(args.torch_env, "bin", "torchrun"), "--nnodes=1",
                        "--nproc_per_node=1", "--max_restarts=1000", "--master_addr=" + address(h),
                        "--master_port=%d" % free_port()]
            out.append(env + where(hosts[h]) + torchrun +
                       [peer, "--hidden", str(args.hidden), "--layers", "3", "--batch", str(batch),
                        "--hostname", address(h)])
        return out
    return argvs


PEER_STEP = re.compile(r"torchft-peer: step \d+ \| samples (\d+)")


def peer_goodput(run):
    """The torchft run's samples in committed steps per second, at its last progress line."""
    last = None
    for t, line in run.lines:
        m = PEER_STEP.search(line)
        if m and (last is None or int(m.group(1)) > last[1]):
            last = (t, int(m.group(1)))
    return 0.0 if last is None else last[1] / (last[0] - run.start)


def trio(args, launcher, train, model, env, batch, ckpt, peer):
    """The goodput runs (--runs), --rounds times, each round in another order."""
    argv = {
        "heal": ([l + ["--on_failure=heal", train] + model for l in launcher], args.kill_every),
        "clean": ([l + ["--on_failure=heal", train] + model for l in launcher], 0),
        "plain": ([l + [train] + model for l in launcher], 0),
        "restart": ([l + [train] + model +
                     ["--checkpoint", os.path.join(ckpt, "ckpt"), "--checkpoint_every", "100",
                      "--resume", "auto"] for l in launcher], args.kill_every),
    }
    order = [name for name in ["heal", "clean", "plain", "restart", "torchft", "torchft-clean"]
             if name in args.runs.split(",") and (peer or not name.startswith("torchft"))]
    g = {name: [] for name in order}
    heals = []
    points = {"heal": [], "clean": []}  # each round's committed samples over time
    kill_times = []  # each heal run's kills, seconds after its start
    n = len(order)
    for r in range(args.rounds):
        for name in order[r % n:] + order[:r % n]:
            for f in os.listdir(ckpt):  # each restart run starts fresh
                os.remove(os.path.join(ckpt, f))
            if name.startswith("torchft"):
                run = drive(peer(), env, args.duration, 0 if name.endswith("clean") else args.kill_every)
                g[name].append(peer_goodput(run))
            else:
                run = drive(argv[name][0], env, args.duration, argv[name][1])
                g[name].append(goodput(run, batch * args.nproc))
            if args.log:
                save_log(run, os.path.join(args.log, "%d-%s.log" % (r, name)))
            if name == "heal":
                heals.append(run)
            if name in ("heal", "clean"):
                points[name].append(committed_samples(run, batch * args.nproc))
                if run.kills:
                    kill_times.append([k - run.start for k in run.kills])
    med = {name: statistics.median(v) for name, v in g.items()}
    # The machine drifts between rounds: each run is also compared with the
    # clean run of its own round, and the median of those ratios reported.
    print("| run | goodput (samples/s), median of %d | vs clean | vs clean of the same round, "
          "median | each round |" % args.rounds)
    print("|---|---:|---:|---:|---|")
    base = med.get("clean", 0)
    for name in sorted(order, key=lambda x: x != "clean"):
        paired = [100 * x / c for x, c in zip(g[name], g.get("clean", [])) if c]
        print("| %s | %.0f | %s | %s | %s |" % (
            name, med[name], "%.1f%%" % (100 * med[name] / base) if base else "n/a",
            "%.1f%% (%s)" % (statistics.median(paired), ", ".join("%.1f%%" % r for r in paired))
            if paired else "n/a", ", ".join("%.0f" % x for x in g[name])))
    if "torchft" in med and med.get("torchft-clean"):
        print("torchft: with faults %.1f%% of its own fault-free run" %
              (100 * med["torchft"] / med["torchft-clean"]))
    if not heals:
        return
    print_progress_lost(points, kill_times, args.kill_every)
    print("heal: kill -> survivors' first committed step: " +
          ms([d for run in heals for d in after_kills(run, r"heal: step \d+ committed")]))
    print("heal: kill -> relaunched rank holds the live state (joined): " +
          ms([d for run in heals for d in after_kills(run, r"heal: joined epoch")]))


def print_progress_lost(points, kill_times, kill_every):
    """What each kill cost the heal run, measured on its own rate before and after the kill,
    beside the same measure taken on the clean runs at the same moments (where nothing
    happened: the measure's own noise on this machine)."""
    window = min(10.0, kill_every / 2)
    times = sorted({t for run in kill_times for t in run})
    lost = [x for pts, ks in zip(points["heal"], kill_times) for k in ks
            for x in [progress_lost(pts, k, window)] if x is not None]
    placebo = [x for pts in points["clean"] for k in times
               for x in [progress_lost(pts, k, window)] if x is not None]
    if not lost:
        return
    line = ("heal: progress lost per kill (%.0f s after it against the %.0f s before, rank 0's "
            "lines): median %.2f s, mean %.2f s, %.2f..%.2f (%d kills); mean %.1f%% of the time "
            "between kills" % (window, window, statistics.median(lost), statistics.mean(lost),
                               min(lost), max(lost), len(lost),
                               100 * statistics.mean(lost) / kill_every))
    if placebo:
        line += ("; the clean runs at the same moments: median %.2f s, mean %.2f s, %.2f..%.2f (%d)"
                 % (statistics.median(placebo), statistics.mean(placebo), min(placebo),
                    max(placebo), len(placebo)))
    print(line)


def save_log(run, path):
    """The run's lines, each with its seconds since the start; `KILL` lines mark the kills."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    marks = [(t, "KILL") for t in run.kills]
    with open(path, "w") as f:
        f.writelines("%.3f %s\n" % (t - run.start, l) for t, l in sorted(run.lines + marks))


def big_heal(launcher, train, env, kills, train_args, log_dir=None):
    """`kills` kills of the 1 GiB run, one at a time: the next once the last relaunch joined."""
    # About 1 GiB per rank: weights + SGD momentum of hidden 11585 x 2 layers.
    big = ["--hidden", "11585", "--layers", "2", "--batch_size", "8", "--input_dim", "64",
           "--steps", "100000000", "--log_every", "1"] + train_args
    run = Run([l + ["--on_failure=heal", train] + big for l in launcher], env)
    deadline = time.time() + 300 + 60 * kills

    def wait_for(what, since):
        while not any(what in l for t, l in run.lines if t > since):
            if run.proc.poll() is not None or time.time() > deadline:
                sys.exit("heal_chaos: the 1 GiB run showed no '%s':\n" % what +
                         "\n".join(l for _, l in run.lines[-20:]))
            time.sleep(0.05)

    wait_for("step 3", 0)
    for k in range(kills):
        run.kill_one()
        wait_for("joined epoch", run.kills[-1])
        wait_for("[rank 0] step ", time.time())  # a step with the relaunch
        time.sleep(1)
    run.stop()
    if log_dir:
        save_log(run, os.path.join(log_dir, "big.log"))
    for t, line in run.lines:
        if "heal:" in line and t > run.kills[-1]:
            print("big (1 GiB state), last kill +%.0f ms: %s" % ((t - run.kills[-1]) * 1e3, line))
    rates = []
    for _, line in run.lines:
        m = re.search(r"heal: joined epoch .* received ([\d.]+) MB .* in ([\d.]+) ms", line)
        if m and float(m.group(2)) > 0:
            rates.append(float(m.group(1)) / float(m.group(2)))  # MB/ms = GB/s
    if rates:
        print("big: the relaunch received the state at median %.2f GB/s; each: %s" %
              (statistics.median(rates), ", ".join("%.2f" % r for r in rates)))
    print("big: kill -> relaunched rank holds the live state (joined): " +
          ms(after_kills(run, r"heal: joined epoch")) + "; each: " +
          ", ".join("%.2f s" % d for d in after_kills(run, r"heal: joined epoch")))
    firsts = first_steps_with_relaunch(run)
    print("big: kill -> first step committed with the relaunch's gradients: " + ms(firsts) +
          "; each: " + ", ".join("%.2f s" % d for d in firsts))


def first_steps_with_relaunch(run):
    """For each kill, seconds until rank 0 reports the first step after the relaunch joined."""
    delays = []
    for k in run.kills:
        joined = [t for t, line in run.lines if t > k and "heal: joined epoch" in line]
        steps = [t for t, line in run.lines
                 if joined and t > joined[0] and re.search(r"\[rank 0\] step \d+", line)]
        if steps:
            delays.append(steps[0] - k)
    return delays


if __name__ == "__main__":
    atexit.register(stop_running)
    signal.signal(signal.SIGTERM, stop_running)
    signal.signal(signal.SIGINT, stop_running)
    sys.exit(main())
