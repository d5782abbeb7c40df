#!/usr/bin/env python3
"""ddprun's TCPStore-compatible store against torch's own TCPStore server.

    sudo python3 bench/store_bench.py BUILD_DIR [--clients 1024,4096,32768] [--rounds 3]

The same load (BUILD_DIR/bench/store_bench: N clients speaking torch's wire
protocol, each SETs its key, WAITs for a common key and its neighbour's,
GETs both) against, in turns, each on a fresh server:
  - ddprun: node rank 0 of a two-node static job on loopback (the store it
    serves on MASTER_PORT to its workers, TORCHELASTIC_USE_AGENT_STORE),
    with node rank 1 beside it; the workers sleep;
  - torch: torch.distributed.TCPStore(is_master=True, use_libuv=True) in
    the torch environment's interpreter (DDP_TORCH_PYTHON, default
    /opt/ddprun-torch/bin/python).
Prints per server and size the median total time, the phases, the server
process's CPU time (user+system, from /proc) and peak RSS, the clients' CPU
time, refusals. On a small machine the clients' own kernel work (a TCP
connection each) bounds the total: compare the servers' CPU too.

Everything runs in a network namespace of its own (loopback only, made and
removed here), with a hosts file naming every client source address
(127.0.0.2, .3, ...): torch's server looks up each client's name, which
would otherwise ask the machine's DNS server. Needs root (the namespace, and
open-file limits above 20,000 for the larger sizes).
"""

import argparse
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time

TORCH_SERVER = """
import datetime, sys, time
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=True, use_libuv=True,
                      wait_for_workers=False, timeout=datetime.timedelta(seconds=600))
print("ready", flush=True)
time.sleep(3600)
"""


class Namespace:
    """A network namespace with loopback up and a hosts file for 127.0.0.x."""

    def __init__(self, sources):
        self.name = f"ddpstore{os.getpid()}"
        self.hosts_dir = f"/etc/netns/{self.name}"
        self.sources = sources

    def __enter__(self):
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True)
        os.makedirs(self.hosts_dir, exist_ok=True)
        with open(f"{self.hosts_dir}/hosts", "w") as f:
            f.write("127.0.0.1 localhost\n::1 localhost\n")
            for i in range(self.sources):
                f.write(f"127.0.0.{i + 2} client-source-{i + 2}\n")
        return self

    def __exit__(self, *exc):
        pids = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True,
                              text=True).stdout
        for pid in pids.split():
            subprocess.run(["kill", "-KILL", pid], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
        subprocess.run(["rm", "-rf", self.hosts_dir])

    def cmd(self, *args):
        return ["ip", "netns", "exec", self.name, *args]


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def wait_for(predicate, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"store_bench.py: {what} did not happen within {timeout} s")
        time.sleep(0.05)


class Server:
    """One fresh server: ddprun's (two-node static job) or torch's."""

    def __init__(self, kind, build, python, ns, port):
        self.kind, self.procs = kind, []
        if kind == "ddprun":
            for node in (0, 1):
                self.procs.append(subprocess.Popen(
                    ns.cmd(f"{build}/launcher/ddprun", "--nnodes=2", f"--node_rank={node}",
                           "--master_addr=127.0.0.1", f"--master_port={port}",
                           "--nproc_per_node=1", "/bin/sleep", "3600"),
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
            # The store is emptied before the workers start: wait for them.
            wait_for(lambda: all(self.children(p.pid) for p in self.procs), "the ddprun job's start")
            self.pid = self.procs[0].pid  # `ip netns exec` execs: the server's own pid
        else:
            p = subprocess.Popen(ns.cmd(python, "-c", TORCH_SERVER, str(port)),
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                 start_new_session=True)
            self.procs.append(p)
            if p.stdout.readline().strip() != "ready":
                raise SystemExit("store_bench.py: torch's TCPStore server did not start")
            self.pid = p.pid

    @staticmethod
    def children(pid):
        try:
            return open(f"/proc/{pid}/task/{pid}/children").read().split()
        except OSError:
            return []

    def stop(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(kind, clients, a, ns, port):
    server = Server(kind, a.build, a.python, ns, port)
    try:
        before = cpu_seconds(server.pid)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(ns.cmd(f"{a.build}/bench/store_bench", "--port", str(port),
                                    "--clients", str(clients), "--timeout_s", str(a.timeout_s)),
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"store_bench.py: {kind}, {clients} clients: {out.stderr.strip()}")
        r = json.loads(out.stdout)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        r["client_cpu_s"] = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
        r["server_cpu_s"] = cpu_seconds(server.pid) - before
        r["server_peak_rss_mib"] = peak_rss_mib(server.pid)
        return r
    finally:
        server.stop()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build")
    p.add_argument("--clients", default="1024,4096,32768")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout_s", type=float, default=300)
    p.add_argument("--servers", default="ddprun,torch")
    p.add_argument("--python", default=os.environ.get("DDP_TORCH_PYTHON",
                                                      "/opt/ddprun-torch/bin/python"))
    a = p.parse_args()
    a.build = os.path.abspath(a.build)
    if os.geteuid() != 0:
        raise SystemExit("store_bench.py: needs root (a network namespace of its own)")
    sizes = [int(n) for n in a.clients.split(",")]
    servers = a.servers.split(",")
    # The server holds a descriptor per client, and so does store_bench.
    need = max(sizes) + 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), max(hard, need)))
    except (ValueError, OSError):
        raise SystemExit(f"store_bench.py: {max(sizes)} clients need {need} open files per "
                         f"process (RLIMIT_NOFILE), and the hard limit here is {hard} (raising "
                         "it needs CAP_SYS_RESOURCE): run fewer --clients")
    runs = {}
    with Namespace(sources=max(sizes) // 16384 + 1) as ns:
        for n in sizes:
            for i in range(a.rounds):
                for kind in (servers if i % 2 == 0 else servers[::-1]):
                    r = run_once(kind, n, a, ns, free_port())
                    runs.setdefault((kind, n), []).append(r)
                    print(f"{kind:7} {n:6} clients, round {i + 1}: {json.dumps(r)}", flush=True)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "?")
    print(f"\n{os.cpu_count()} CPUs ({cpu}); medians of {a.rounds} rounds, fresh server each")
    print(f"{'server':8} {'clients':>7} {'total s':>8} {'connect':>8} {'set':>7} {'wake':>7} "
          f"{'get':>7} {'srv cpu s':>9} {'peak MiB':>8} {'cli cpu s':>9} {'refused':>7}")
    for n in sizes:
        for kind in servers:
            rs = runs[(kind, n)]
            m = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            print(f"{kind:8} {n:7} {m['total_s']:8.3f} {m['connect_s']:8.3f} {m['set_s']:7.3f} "
                  f"{m['wake_s']:7.3f} {m['get_s']:7.3f} {m['server_cpu_s']:9.2f} "
                  f"{m['server_peak_rss_mib']:8.1f} {m['client_cpu_s']:9.2f} "
                  f"{max(r['refused'] for r in rs):7d}")
        if len(servers) == 2:
            t = [statistics.median(r["total_s"] for r in runs[(k, n)]) for k in servers]
            print(f"{'':8} {n:7} {servers[1]}/{servers[0]} total: {t[1] / t[0]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
