#!/usr/bin/env bash
# Restart after a worker failure: ddprun vs torchrun 2.x, side by side, one node.
# Usage: bench/restart_latency.sh BUILD_DIR [RUNS] [NPROC]
# NPROC (default 4) trivial Python workers under --max_restarts=1; in the first
# attempt (TORCHELASTIC_RESTART_COUNT=0) the last rank exits 1 once every rank
# is running. Each worker prints a wall-clock stamp when it starts, the failing
# one just before it exits. Prints the median over RUNS (launchers taking
# turns within each run) of: failure to every worker of the second attempt
# running, and failure to the launcher's exit; then torchrun / ddprun.
# torchrun's workers run under the same /usr/bin/python3 as ddprun's (PYTHON_EXEC).
set -euo pipefail
BUILD_DIR=$(cd "${1:-build}" && pwd)
RUNS=${2:-7}
NPROC=${3:-4}
DDPRUN="$BUILD_DIR/launcher/ddprun"
SYSPY=/usr/bin/python3
TORCHRUN2=${DDP_TORCH_ENV:-/opt/ddprun-torch}/bin/torchrun  # scripts/install-torch-env.sh
[[ -x $DDPRUN ]] || { echo "restart_latency: $DDPRUN missing: build first" >&2; exit 1; }
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

cat > "$OUT/worker.py" <<'PY'
# Starts, and in the first attempt the last rank fails once all ranks are up.
import os, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
marks = os.environ["BENCH_MARKS"]
print("START %d %.6f" % (attempt, time.time()), flush=True)
open(os.path.join(marks, "%d.%d" % (attempt, rank)), "w").close()
if attempt == 0:
    if rank == world - 1:
        while len([f for f in os.listdir(marks) if f.startswith("0.")]) < world:
            time.sleep(0.001)
        print("FAIL %.6f" % time.time(), flush=True)
        sys.exit(1)
    time.sleep(60)  # stopped by the launcher
PY

# One job; prints "seconds_to_all_restarted seconds_to_exit" after the failure.
run_job() {
  local kind=$1 marks=$OUT/marks.$1 log=$OUT/$1.log
  rm -rf "$marks"; mkdir -p "$marks"
  if [[ $kind == ddprun ]]; then
    BENCH_MARKS=$marks "$DDPRUN" --nproc_per_node="$NPROC" --max_restarts=1 --no_prefix \
      "$SYSPY" "$OUT/worker.py" >"$log" 2>&1 || true
  else
    BENCH_MARKS=$marks PYTHON_EXEC=$SYSPY "$TORCHRUN2" --standalone --monitor-interval 0.1 \
      --nproc-per-node="$NPROC" --max-restarts=1 "$OUT/worker.py" >"$log" 2>&1 || true
  fi
  local t_end
  t_end=$(date +%s.%N)
  $SYSPY - "$log" "$t_end" "$NPROC" <<'PY'
import re, sys
text, t_end, n = open(sys.argv[1]).read(), float(sys.argv[2]), int(sys.argv[3])
fail = [float(x) for x in re.findall(r"FAIL (\d+\.\d+)", text)]
second = [float(x) for x in re.findall(r"START 1 (\d+\.\d+)", text)]
if len(fail) != 1 or len(second) != n:
    sys.exit("expected one failure and %d restarted workers, got %d and %d:\n%s"
             % (n, len(fail), len(second), text[-2000:]))
print("%.4f %.4f" % (max(second) - fail[0], t_end - fail[0]))
PY
}

have_torchrun=0
[[ -x $TORCHRUN2 ]] && have_torchrun=1
: >"$OUT/ddprun.txt"
: >"$OUT/torchrun.txt"
for _ in $(seq "$RUNS"); do
  run_job ddprun >>"$OUT/ddprun.txt"
  if [[ $have_torchrun == 1 ]]; then run_job torchrun >>"$OUT/torchrun.txt"; fi
done
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo "$NPROC workers, one fails in the first attempt, --max_restarts=1; median of $RUNS runs, seconds after the failure:"
$SYSPY - "$OUT/ddprun.txt" "$OUT/torchrun.txt" <<'PY'
import statistics as st, sys
def med(path):
    rows = [list(map(float, l.split())) for l in open(path) if l.strip()]
    return [st.median(c) for c in zip(*rows)] if rows else None
d, t = med(sys.argv[1]), med(sys.argv[2])
print("%-16s %16s %12s" % ("launcher", "all_restarted", "exit"))
print("%-16s %16.3f %12.3f" % ("ddprun", *d))
if t:
    print("%-16s %16.3f %12.3f" % ("torchrun 2.x", *t))
    print("%-16s %15.1fx %11.1fx" % ("torchrun/ddprun", t[0] / d[0], t[1] / d[1]))
else:
    print("torchrun 2.x: not installed (scripts/install-torch-env.sh)")
PY
