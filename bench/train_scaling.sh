#!/usr/bin/env bash
# Scaling of the reference trainer on this machine: training throughput
# (samples/s, steady state) with 2 ranks against 1 rank, one thread per rank.
#
#   bash bench/train_scaling.sh [BUILD_DIR=build-release] [REPS=5]
#
# Model: the shape of ../shared/peers/ddp_step.py (torch DDP's figure):
# 1024 inputs, 3 hidden layers of 1024, 10 classes = 3x Linear(1024,1024) +
# Linear(1024,10), 3,159,050 parameters (12.6 MB of float32 gradients); batch
# 64 per rank (the global batch grows with the ranks, as in weak scaling);
# SGD with momentum; DDP_BACKEND (default shm; gloo to compare); BUCKET_MB MiB
# buckets (default 25, torch DDP's default). Each repetition runs, back to back:
#   1 rank      ddprun --nproc_per_node=1 train ...
#   2 ranks     ddprun --nproc_per_node=2 train ...
#   2 sharded   the same with --shard_optimizer (ZeRO stage 1: each rank runs
#               SGD on its half of the parameters, then the halves are
#               all-gathered; the same losses to the last digit)
#   ceiling     two independent 1-rank trainers at once (no communication):
#               what two processes sharing this machine reach by themselves
# and the ratio 2 ranks / 1 rank. Figures are medians over the repetitions
# (the two cores are shared with everything else, so single runs vary by
# +-15%). Target: ratio >= 1.92x.
set -euo pipefail
BUILD_DIR=${1:-build-release}
REPS=${2:-5}
STEPS=${STEPS:-60}
DDPRUN="$BUILD_DIR/launcher/ddprun"
TRAIN="$BUILD_DIR/worker/examples/train"
ARGS=(--input_dim 1024 --hidden 1024 --layers 3 --output_dim 10 --task classification
      --batch_size 64 --steps "$STEPS" --log_every 100000 --dataset_size 8192
      --optimizer sgd --lr 0.01 --momentum 0.9 --bucket_cap_mb "${BUCKET_MB:-25}")
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 DDP_BACKEND=${DDP_BACKEND:-shm}

steady() { sed -n 's/.*steady \([0-9]*\) samples\/s.*/\1/p'; }
median() { sort -n | awk '{v[NR]=$1} END {if (NR % 2) print v[(NR+1)/2]; else printf "%.0f\n", (v[NR/2]+v[NR/2+1])/2}'; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf "# train: %s, batch 64 per rank, %s steps (steady = after the first 6), %s repetitions\n" \
  "MLP 1024-1024-1024-1024-10 (3159050 parameters)" "$STEPS" "$REPS"
printf "%4s %14s %14s %14s %18s %9s %9s\n" rep "1 rank (s/s)" "2 ranks (s/s)" "2 sharded" "ceiling 2x1 (s/s)" "2 vs 1" "sharded"
for rep in $(seq 1 "$REPS"); do
  one=$("$DDPRUN" --nproc_per_node=1 --no_prefix "$TRAIN" "${ARGS[@]}" 2>/dev/null | steady)
  "$DDPRUN" --nproc_per_node=2 --no_prefix "$TRAIN" "${ARGS[@]}" >"$tmp/two.txt" 2>/dev/null
  two=$(steady <"$tmp/two.txt")
  "$DDPRUN" --nproc_per_node=2 --no_prefix "$TRAIN" "${ARGS[@]}" --shard_optimizer >"$tmp/sharded.txt" 2>/dev/null
  sharded=$(steady <"$tmp/sharded.txt")
  "$TRAIN" "${ARGS[@]}" >"$tmp/a.txt" 2>/dev/null &
  a=$!
  "$TRAIN" "${ARGS[@]}" >"$tmp/b.txt" 2>/dev/null
  wait "$a"
  ceiling=$(( $(steady <"$tmp/a.txt") + $(steady <"$tmp/b.txt") ))
  echo "$one" >>"$tmp/one.all"
  echo "$two" >>"$tmp/two.all"
  echo "$sharded" >>"$tmp/sharded.all"
  echo "$ceiling" >>"$tmp/ceiling.all"
  printf "%4s %14s %14s %14s %18s %8.3fx %8.3fx\n" "$rep" "$one" "$two" "$sharded" "$ceiling" \
    "$(awk -v a="$two" -v b="$one" 'BEGIN {print a / b}')" "$(awk -v a="$sharded" -v b="$one" 'BEGIN {print a / b}')"
done
one=$(median <"$tmp/one.all")
two=$(median <"$tmp/two.all")
sharded=$(median <"$tmp/sharded.all")
ceiling=$(median <"$tmp/ceiling.all")
ratio=$(awk -v a="$two" -v b="$one" 'BEGIN {printf "%.3f", a / b}')
sharded_ratio=$(awk -v a="$sharded" -v b="$one" 'BEGIN {printf "%.3f", a / b}')
ceiling_ratio=$(awk -v a="$ceiling" -v b="$one" 'BEGIN {printf "%.3f", a / b}')
printf "%4s %14s %14s %14s %18s %8.3fx %8.3fx\n" median "$one" "$two" "$sharded" "$ceiling" "$ratio" "$sharded_ratio"
echo "last 2-rank runs' GradSync figures (plain, then sharded):"
grep -h "summary: gradient sync" "$tmp/two.txt" "$tmp/sharded.txt" | sed 's/^/  /'
grep -q "final loss $(sed -n 's/.*final loss \([^ ]*\).*/\1/p' "$tmp/two.txt") " "$tmp/sharded.txt" &&
  echo "plain and sharded runs end with the same loss: yes" || echo "plain and sharded runs end with the same loss: NO"
echo "scaling 2 ranks vs 1: ${ratio}x plain, ${sharded_ratio}x with --shard_optimizer (machine ceiling without communication: ${ceiling_ratio}x)"
for target in 1.92 1.95; do
  for pair in "plain:$ratio" "sharded:$sharded_ratio"; do
    if awk -v r="${pair#*:}" -v t="$target" 'BEGIN {exit !(r >= t)}'; then verdict=MET; else verdict="NOT MET"; fi
    echo "target >= ${target}x, ${pair%%:*}: $verdict"
  done
done
