#!/usr/bin/env python3
"""The rendezvous server at 1,024 to 16,384 nodes, with real clients.

    python3 bench/rdzv_scale.py BUILD_DIR [--nodes 1024,4096,16384] [--rounds 3]

For each size, a fresh `ddprun rendezvous` (the server a job uses, on
127.0.0.1) and N simulated node agents with 8 workers each
(BUILD_DIR/bench/rdzv_scale_bench), spread over processes of at most 4,096
agents, one gRPC connection per agent. Once every agent is connected, all
call Join at one moment; then one barrier over every node. Prints per size the medians of:
  - assigned: the last agent's rank assignment, after the last Join was sent;
  - barrier: the last agent through the barrier, after the last assignment;
  - the server's CPU time (user+system, /proc) over that stretch, and its
    resident memory once every agent is connected and after the barrier.
Needs an open-file limit above N + 64 for the server (20,000 here holds
16,384 agents).
"""

import argparse
import json
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import time

PER_PROCESS = 4096


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid):
    """0 when the process has exited (a zombie has no VmRSS)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def established(pid):
    """The server's TCP connections (its descriptors that are sockets)."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


def run_once(build, nodes, workers):
    run_id = f"scale{os.getpid()}"
    server = subprocess.Popen(
        [f"{build}/launcher/ddprun", "rendezvous", "--host", "127.0.0.1", "--port", "0",
         "--run_id", run_id, "--nnodes", str(nodes), "--rdzv_token", "bench",
         "--rdzv_conf", "join_timeout=300,last_call_timeout=0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    clients = []
    try:
        line = server.stdout.readline()
        m = re.search(r"listening on (\S+):(\d+)", line)
        if not m:
            raise SystemExit(f"rdzv_scale.py: the server did not start: {line.strip()}")
        endpoint = f"127.0.0.1:{m.group(2)}"
        for first in range(0, nodes, PER_PROCESS):
            count = min(PER_PROCESS, nodes - first)
            clients.append(subprocess.Popen(
                [f"{build}/bench/rdzv_scale_bench", "--endpoint", endpoint, "--run_id", run_id,
                 "--token", "bench", "--nnodes", str(nodes), "--first", str(first),
                 "--count", str(count), "--workers", str(workers)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        # Every agent connected (and its connection warm) before the clock starts.
        for c in clients:
            if c.stdout.readline().strip() != "ready":
                raise SystemExit(f"rdzv_scale.py: {nodes} nodes: {c.communicate()[1].strip()}")
        connected = established(server.pid)
        rss_before = rss_mib(server.pid)
        cpu_before = cpu_seconds(server.pid)
        agents_before = [cpu_seconds(c.pid) for c in clients]
        for c in clients:
            c.stdin.write("go\n")
            c.stdin.flush()
        # Each agents process's CPU time, read just before it exits (the
        # processes print their result, then wait for stdin to close).
        outs = [(c.stdout.readline(), "") for c in clients]
        agents_cpu = sum(cpu_seconds(c.pid) - b for c, b in zip(clients, agents_before))
        for c in clients:
            c.stdin.close()
        outs = [(o, c.stderr.read()) for c, (o, _) in zip(clients, outs)]
        for c in clients:
            c.wait(timeout=60)
        cpu = cpu_seconds(server.pid) - cpu_before
        rss_after = rss_mib(server.pid)
        for c, (out, err) in zip(clients, outs):
            if c.returncode != 0:
                raise SystemExit(f"rdzv_scale.py: {nodes} nodes: {err.strip()}")
        rs = [json.loads(out) for out, _ in outs]
        last_sent = max(r["last_join_sent_ns"] for r in rs)
        last_joined = max(r["last_joined_ns"] for r in rs)
        last_barrier = max(r["last_barrier_ns"] for r in rs)
        return {"assigned_ms": (last_joined - last_sent) / 1e6,
                "barrier_ms": (last_barrier - last_joined) / 1e6,
                "server_cpu_s": cpu, "agents_cpu_s": agents_cpu, "connections": connected,
                "rss_connected_mib": rss_before, "rss_after_mib": rss_after}
    finally:
        for c in clients:
            if c.poll() is None:
                c.kill()
                c.wait()
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build")
    p.add_argument("--nodes", default="1024,4096,16384")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=8)
    a = p.parse_args()
    build = os.path.abspath(a.build)
    sizes = [int(n) for n in a.nodes.split(",")]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max(sizes) + 1024
    if hard < need:
        raise SystemExit(f"rdzv_scale.py: {max(sizes)} nodes need {need} open files for the "
                         f"server (RLIMIT_NOFILE), and the hard limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    results = {}
    for n in sizes:
        for i in range(a.rounds):
            r = run_once(build, n, a.workers)
            results.setdefault(n, []).append(r)
            print(f"{n:6} nodes, round {i + 1}: {json.dumps(r)}", flush=True)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "?")
    print(f"\n{os.cpu_count()} CPUs ({cpu}); medians of {a.rounds} rounds, {a.workers} workers "
          "per node, a fresh server each")
    print(f"{'nodes':>6} {'assigned ms':>11} {'barrier ms':>10} {'server cpu s':>12} {'agents cpu s':>12} "
          f"{'RSS connected':>13} {'RSS after':>9} {'KiB/node':>8}")
    for n in sizes:
        m = {k: statistics.median(r[k] for r in results[n]) for k in results[n][0]}
        print(f"{n:6} {m['assigned_ms']:11.1f} {m['barrier_ms']:10.1f} {m['server_cpu_s']:12.2f} {m['agents_cpu_s']:12.2f} "
              f"{m['rss_connected_mib']:13.1f} {m['rss_after_mib']:9.1f} "
              f"{(m['rss_after_mib'] - m['rss_connected_mib']) * 1024 / n:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
