#!/usr/bin/env bash
# The cost of ddprun's observability (docs/observability.md) on the reference
# trainer: steady samples/s with status sampling, metrics and the event log
# on (straggler tracking and libddp's step timing with them), against all of
# them off (--status_interval=0, no --metrics_port, no --events_file: no
# progress board either), in alternating runs of the same build, same machine, same
# command; prints each run and the medians.
# Usage: bench/observability_overhead.sh [BUILD_DIR] [ROUNDS] [STEPS] [NPROC]
set -euo pipefail
B=${1:-build-release}
ROUNDS=${2:-7}
STEPS=${3:-10000}
NPROC=${4:-2}
DDPRUN="$B/launcher/ddprun"
TRAIN="$B/examples/train"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

steady() {  # the trainer's "steady N samples/s" from its summary line
  sed -n 's/.*steady \([0-9.]*\) samples\/s.*/\1/p' | head -1
}

run() {
  local mode=$1
  local flags=(--status_interval=0)
  if [[ $mode == on ]]; then
    flags=(--status_interval=1 --metrics_port="$(port)" --events_file="$TMP/events.jsonl")
  fi
  "$DDPRUN" --nproc_per_node="$NPROC" "${flags[@]}" "$TRAIN" --steps "$STEPS" --log_every 100000 2>&1 | steady
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPU(s)"
echo "command: $DDPRUN --nproc_per_node=$NPROC [flags] $TRAIN --steps $STEPS"
echo "  off: --status_interval=0"
echo "  on:  --status_interval=1 --metrics_port=P --events_file=F"
: > "$TMP/off"
: > "$TMP/on"
for ((i = 1; i <= ROUNDS; i++)); do
  # Which mode runs first alternates: a drift of the machine within a round
  # (another tenant, the frequency) does not favour one mode.
  order=(off on)
  ((i % 2 == 0)) && order=(on off)
  for mode in "${order[@]}"; do
    v=$(run "$mode")
    echo "$v" >> "$TMP/$mode"
    printf 'round %d %-3s %s samples/s\n' "$i" "$mode" "$v"
  done
done
off=$(median < "$TMP/off")
on=$(median < "$TMP/on")
awk -v off="$off" -v on="$on" 'BEGIN {printf "median off %.0f samples/s, on %.0f samples/s: on/off = %.4f (%+.2f%%)\n", off, on, on/off, (on/off-1)*100}'
