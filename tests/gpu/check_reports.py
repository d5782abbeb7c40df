#!/usr/bin/env python3
"""Reads the logs of the GPU checks (gpu-check.sh) and judges them.

Prints one line, `OK <figures>` or `FAIL <reason>`, and exits 0 or 1. Needs
only the standard library (no torch).

    check_reports.py torch N DDPRUN_LOG T0 [TORCHRUN_LOG T0]
        torch_ddp_check.py under both launchers: N ranks each, final losses
        equal (1e-5 relative); T0 (seconds since the epoch, taken just before
        the launcher started) times launch -> first all-reduce on rank 0.
    check_reports.py lightning N DDPRUN_LOG [TORCHRUN_LOG]
        lightning_check.py: N reports from N distinct processes, ranks 0..N-1,
        world N, TorchElasticEnvironment, processes created externally; the
        torchrun launch reports the same world, ranks and metric (1e-5).
    check_reports.py curve REFERENCE_LOG LOG TOLERANCE
        train's "[rank 0] step K/T | ... | loss X" lines: the same steps, each
        loss within TOLERANCE (relative) of the reference's.
    check_reports.py throughput TRAIN_LOG EAGER_LOG
        train's steady samples/s over eager PyTorch's samples/s.
"""

import re
import sys


def fields(line):
    return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)


MARKERS = re.compile(r"(FINAL |FIRST_ALLREDUCE |REPORT |EAGER )")


def lines(path, prefix):
    # A launcher that tees its workers' output may join two ranks' lines
    # ("...loss=0.1FINAL rank=1 ..."): each marker starts a line of its own.
    with open(path, errors="replace") as f:
        text = MARKERS.sub(lambda m: "\n" + m.group(1), f.read())
    return [fields(l[l.index(prefix):]) for l in text.splitlines() if prefix in l]


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def fail(reason):
    print(f"FAIL {reason}")
    sys.exit(1)


def torch_run(n, log, t0, who):
    finals = lines(log, "FINAL ")
    firsts = [f for f in lines(log, "FIRST_ALLREDUCE ") if f.get("rank") == "0"]
    if len(finals) != n:
        fail(f"{who}: {len(finals)} FINAL line(s) in {log}, expected {n}")
    if not firsts:
        fail(f"{who}: no FIRST_ALLREDUCE line from rank 0 in {log}")
    worlds = {f["world"] for f in finals}
    if worlds != {str(n)}:
        fail(f"{who}: world size(s) {sorted(worlds)}, expected {n}")
    losses = {f["loss"] for f in finals}
    if len(losses) != 1:
        fail(f"{who}: the ranks print different losses {sorted(losses)}")
    return float(finals[0]["loss"]), float(firsts[0]["wall"]) - t0, finals[0].get("backend", "?")


def cmd_torch(args):
    n = int(args[0])
    loss, launch, backend = torch_run(n, args[1], float(args[2]), "ddprun")
    text = f"backend {backend}, {n} rank(s): ddprun final loss {loss:.8f}, launch to first all-reduce {launch:.2f} s"
    if len(args) >= 4:
        t_loss, t_launch, _ = torch_run(n, args[3], float(args[4]), "torchrun")
        text += f"; torchrun final loss {t_loss:.8f}, launch to first all-reduce {t_launch:.2f} s"
        if relative(loss, t_loss) > 1e-5:
            fail(f"final losses differ: ddprun {loss:.8f} vs torchrun {t_loss:.8f}; {text}")
    print(f"OK {text}")


def lightning_run(n, log, who):
    reports = lines(log, "REPORT ")
    if len(reports) != n:
        fail(f"{who}: {len(reports)} REPORT line(s) in {log}, expected {n} (one per rank)")
    pids = {r["pid"] for r in reports}
    if len(pids) != n:
        fail(f"{who}: {len(pids)} distinct process(es) reported for {n} ranks")
    ranks = sorted(int(r["rank"]) for r in reports)
    if ranks != list(range(n)):
        fail(f"{who}: ranks {ranks}, expected 0..{n - 1}")
    worlds = {r["world"] for r in reports}
    if worlds != {str(n)}:
        fail(f"{who}: world size(s) {sorted(worlds)}, expected {n}")
    envs = {r["env"] for r in reports}
    if envs != {"TorchElasticEnvironment"}:
        fail(f"{who}: Lightning's cluster environment is {sorted(envs)}, not TorchElasticEnvironment")
    if {r["external"] for r in reports} != {"1"}:
        fail(f"{who}: Lightning would create the processes itself (creates_processes_externally false)")
    # The launcher's children: with --nproc_per_node the ranks share their parent.
    metrics = {r["metric"] for r in reports}
    if len(metrics) != 1:
        fail(f"{who}: the ranks log different metrics {sorted(metrics)}")
    return float(reports[0]["metric"]), reports[0]["package"], reports[0]["strategy"], len({r["ppid"] for r in reports})


def cmd_lightning(args):
    n = int(args[0])
    metric, package, strategy, parents = lightning_run(n, args[1], "ddprun")
    text = (f"{package} {strategy}, {n} rank(s) in {n} processes started by ddprun ({parents} parent), "
            f"TorchElasticEnvironment, final train_loss {metric:.8f}")
    if len(args) >= 3:
        t_metric, _, _, _ = lightning_run(n, args[2], "torchrun")
        text += f"; torchrun: same world and ranks, train_loss {t_metric:.8f}"
        if relative(metric, t_metric) > 1e-5:
            fail(f"final metrics differ: ddprun {metric:.8f} vs torchrun {t_metric:.8f}")
    print(f"OK {text}")


STEP = re.compile(r"\[rank 0\] step (\d+)/\d+ .*\| loss ([-+0-9.eEnaif]+)")


def curve(path):
    result = {}
    with open(path, errors="replace") as f:
        for line in f:
            m = STEP.search(line)
            if m:
                result[int(m.group(1))] = float(m.group(2))
    return result


def cmd_curve(args):
    reference, other, tolerance = curve(args[0]), curve(args[1]), float(args[2])
    if not reference:
        fail(f"no '[rank 0] step K/T ... | loss X' lines in {args[0]}")
    if sorted(reference) != sorted(other):
        fail(f"steps differ: {len(reference)} in {args[0]}, {len(other)} in {args[1]}")
    worst = max(relative(other[s], reference[s]) for s in reference)
    if worst > tolerance:
        step = max(reference, key=lambda s: relative(other[s], reference[s]))
        fail(f"step {step}: loss {other[step]} vs {reference[step]} (relative {worst:.2e} > {tolerance})")
    last = max(reference)
    print(f"OK {len(reference)} steps, largest relative difference {worst:.2e} (<= {tolerance}); "
          f"step {last} loss {other[last]:.6f} vs {reference[last]:.6f}")


def cmd_throughput(args):
    with open(args[0], errors="replace") as f:
        m = re.search(r"steady (\d+) samples/s", f.read())
    if not m:
        fail(f"no 'steady N samples/s' in {args[0]}")
    eager = lines(args[1], "EAGER ")
    if not eager:
        fail(f"no EAGER line in {args[1]}")
    ours, theirs = float(m.group(1)), float(eager[-1]["samples_per_s"])
    print(f"OK train {ours:.0f} samples/s, PyTorch eager {theirs:.0f} samples/s, ratio {ours / theirs:.2f}")


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("torch", "lightning", "curve", "throughput"):
        print(__doc__)
        sys.exit(2)
    try:
        {"torch": cmd_torch, "lightning": cmd_lightning, "curve": cmd_curve,
         "throughput": cmd_throughput}[sys.argv[1]](sys.argv[2:])
    except (OSError, ValueError, KeyError, IndexError) as e:
        fail(f"cannot read the logs: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
