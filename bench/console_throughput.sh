#!/usr/bin/env bash
# Console throughput: 4 ranks each write 25 MB of 100-byte lines (100 MB in
# all) through ddprun's prefixed, whole-line console path to a file.
# Usage: bench/console_throughput.sh DDPRUN [OTHER_DDPRUN] [ROUNDS]
# With two binaries (e.g. before and after a change) they take turns, round
# by round, and the medians are printed side by side with their ratio.
set -euo pipefail
A=$1
B=${2:-}
ROUNDS=${3:-7}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
LINE=$(printf '%099d' 0)
once() {  # seconds for one run of ddprun $1
  local start end
  start=$(date +%s.%N)
  "$1" --nproc_per_node=4 sh -c "yes $LINE | head -n 250000" >"$OUT/console" 2>/dev/null
  end=$(date +%s.%N)
  [[ $(wc -l <"$OUT/console") == 1000000 ]] || { echo "lost lines" >&2; exit 1; }
  python3 -c "print($end - $start)"
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
: >"$OUT/a"; : >"$OUT/b"
for ((r = 0; r < ROUNDS; ++r)); do
  once "$A" >>"$OUT/a"
  [[ -n $B ]] && once "$B" >>"$OUT/b"
done
ma=$(median <"$OUT/a")
printf '%-40s median %.3f s  %.0f MB/s\n' "$A" "$ma" "$(python3 -c "print(100 / $ma)")"
if [[ -n $B ]]; then
  mb=$(median <"$OUT/b")
  printf '%-40s median %.3f s  %.0f MB/s\n' "$B" "$mb" "$(python3 -c "print(100 / $mb)")"
  printf 'time, second / first: %.3f\n' "$(python3 -c "print($mb / $ma)")"
fi
