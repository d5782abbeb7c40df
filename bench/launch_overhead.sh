#!/usr/bin/env bash
# Wall time to launch and reap N trivial workers: ddprun vs torchrun 2.x vs mpirun, side by side in one run.
# Usage: bench/launch_overhead.sh BUILD_DIR [RUNS]
# Prints, per N: the median wall time of each launcher, of the same N workers started directly by a
# shell (the baseline), the launcher's own overhead (median - baseline; noisy when it is a few ms)
# and the wall time as a multiple of ddprun's with the same workers.
set -euo pipefail
BUILD_DIR=$(cd "${1:-build}" && pwd)
RUNS=${2:-20}
DDPRUN="$BUILD_DIR/launcher/ddprun"
SYSPY=/usr/bin/python3
TORCHRUN2=${DDP_TORCH_ENV:-/opt/ddprun-torch}/bin/torchrun  # scripts/install-torch-env.sh
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
printf 'import os\nassert "RANK" in os.environ\n' > "$OUT/trivial.py"

if ! command -v hyperfine >/dev/null; then echo "hyperfine missing: run scripts/install-deps.sh" >&2; exit 1; fi

# median wall time of a command in ms
measure() {
  hyperfine -N --warmup 2 --runs "$RUNS" --export-json "$OUT/r.json" "$1" >/dev/null 2>&1 || { echo nan; return; }
  $SYSPY -c "import json,statistics as s;t=json.load(open('$OUT/r.json'))['results'][0]['times'];print(round(s.median(t)*1e3,2))"
}
# N copies of a command started by a shell, in parallel (what any launcher must at least do)
direct() {
  local n=$1; shift
  echo "bash -c 'for i in \$(seq $n); do RANK=\$i $* & done; wait'"
}
calc() { $SYSPY -c "print(round($1, 2))" 2>/dev/null || echo nan; }

printf '%-28s %3s %12s %12s %14s %14s\n' launcher N median_ms baseline_ms overhead_ms wall_vs_ddprun
for N in 1 4 8; do
  base_true=$(measure "$(direct "$N" /bin/true)")
  base_py=$(measure "$(direct "$N" "$SYSPY $OUT/trivial.py")")
  ddp_true=$(measure "$DDPRUN --nproc_per_node=$N /bin/true")
  ddp_py=$(measure "$DDPRUN --nproc_per_node=$N $SYSPY $OUT/trivial.py")
  ddp_over_true=$(calc "$ddp_true - $base_true")
  ddp_over_py=$(calc "$ddp_py - $base_py")
  printf '%-28s %3s %12s %12s %14s %14s\n' "ddprun /bin/true" "$N" "$ddp_true" "$base_true" "$ddp_over_true" "1.0"
  printf '%-28s %3s %12s %12s %14s %14s\n' "ddprun trivial.py" "$N" "$ddp_py" "$base_py" "$ddp_over_py" "1.0"
  if [[ -x $TORCHRUN2 ]]; then
    # torchrun 2.x from the torch environment; its workers run under the same
    # python3 as ddprun's (PYTHON_EXEC), so only the launchers differ.
    t=$(measure "env PYTHON_EXEC=$SYSPY $TORCHRUN2 --standalone --monitor-interval 0.1 --nproc-per-node=$N $OUT/trivial.py")
    over=$(calc "$t - $base_py")
    printf '%-28s %3s %12s %12s %14s %14s\n' "torchrun 2.x (mi=0.1)" "$N" "$t" "$base_py" "$over" "$(calc "$t / $ddp_py")"
  fi
  if command -v mpirun >/dev/null; then
    m=$(measure "mpirun --allow-run-as-root --oversubscribe -np $N /bin/true")
    over=$(calc "$m - $base_true")
    printf '%-28s %3s %12s %12s %14s %14s\n' "mpirun /bin/true" "$N" "$m" "$base_true" "$over" "$(calc "$m / $ddp_true")"
  fi
done
