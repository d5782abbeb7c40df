#!/usr/bin/env bash
# Wall time to launch and reap N trivial workers: ddprun vs torchrun vs mpirun, side by side in one run.
# Usage: bench/launch_overhead.sh BUILD_DIR [RUNS]. Prints `name  N  median_ms  min_ms  ratio_vs_ddprun`.
set -euo pipefail
BUILD_DIR=$(cd "${1:-build}" && pwd)
RUNS=${2:-20}
DDPRUN="$BUILD_DIR/launcher/ddprun"
SYSPY=/usr/bin/python3
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
printf 'import os\nassert "RANK" in os.environ\n' > "$OUT/trivial.py"

if ! command -v hyperfine >/dev/null; then echo "hyperfine missing: run scripts/install-deps.sh" >&2; exit 1; fi

# median and min of a command in ms
measure() {
  hyperfine -N --warmup 2 --runs "$RUNS" --export-json "$OUT/r.json" "$1" >/dev/null 2>&1 || { echo "nan nan"; return; }
  $SYSPY -c "import json,statistics as s;t=json.load(open('$OUT/r.json'))['results'][0]['times'];print(round(s.median(t)*1e3,2),round(min(t)*1e3,2))"
}

printf '%-34s %3s %10s %10s %14s\n' tool N median_ms min_ms vs_ddprun
for N in 1 4 8; do
  read -r base_med base_min <<<"$(measure "$DDPRUN --nproc_per_node=$N /bin/true")"
  printf '%-34s %3s %10s %10s %14s\n' "ddprun /bin/true" "$N" "$base_med" "$base_min" "1.00"
  row() {
    read -r med mn <<<"$(measure "$2")"
    ratio=$($SYSPY -c "print(round($med/$base_med,1))" 2>/dev/null || echo nan)
    printf '%-34s %3s %10s %10s %14s\n' "$1" "$N" "$med" "$mn" "$ratio"
  }
  row "ddprun python3 trivial.py" "$DDPRUN --nproc_per_node=$N $SYSPY $OUT/trivial.py"
  if [[ -x /usr/bin/torchrun ]]; then
    row "torchrun(mi=0.1) trivial.py" "/usr/bin/torchrun --standalone --redirects 9:1 --tee 9:1 --monitor_interval 0.1 --nproc_per_node=$N $OUT/trivial.py"
  fi
  if command -v mpirun >/dev/null; then
    row "mpirun /bin/true" "mpirun --allow-run-as-root --oversubscribe -np $N /bin/true"
  fi
done
