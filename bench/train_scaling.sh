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
printf "%4s %16s %16s %18s %10s\n" rep "1 rank (s/s)" "2 ranks (s/s)" "ceiling 2x1 (s/s)" "2 vs 1"
for rep in $(seq 1 "$REPS"); do
  one=$("$DDPRUN" --nproc_per_node=1 --no_prefix "$TRAIN" "${ARGS[@]}" 2>/dev/null | steady)
  "$DDPRUN" --nproc_per_node=2 --no_prefix "$TRAIN" "${ARGS[@]}" >"$tmp/two.txt" 2>/dev/null
  two=$(steady <"$tmp/two.txt")
  "$TRAIN" "${ARGS[@]}" >"$tmp/a.txt" 2>/dev/null &
  a=$!
  "$TRAIN" "${ARGS[@]}" >"$tmp/b.txt" 2>/dev/null
  wait "$a"
  ceiling=$(( $(steady <"$tmp/a.txt") + $(steady <"$tmp/b.txt") ))
  echo "$one" >>"$tmp/one.all"
  echo "$two" >>"$tmp/two.all"
  echo "$ceiling" >>"$tmp/ceiling.all"
  awk -v a="$two" -v b="$one" 'BEGIN {print a / b}' >>"$tmp/ratio.all"
  printf "%4s %16s %16s %18s %9.3fx\n" "$rep" "$one" "$two" "$ceiling" "$(tail -1 "$tmp/ratio.all")"
done
one=$(median <"$tmp/one.all")
two=$(median <"$tmp/two.all")
ceiling=$(median <"$tmp/ceiling.all")
ratio=$(awk -v a="$two" -v b="$one" 'BEGIN {printf "%.3f", a / b}')
ceiling_ratio=$(awk -v a="$ceiling" -v b="$one" 'BEGIN {printf "%.3f", a / b}')
printf "%4s %16s %16s %18s %9.3fx\n" median "$one" "$two" "$ceiling" "$ratio"
echo "last 2-rank run's GradSync figures:"
grep "summary: gradient sync" "$tmp/two.txt" | sed 's/^/  /'
echo "scaling 2 ranks vs 1: ${ratio}x (machine ceiling without communication: ${ceiling_ratio}x)"
if awk -v r="$ratio" 'BEGIN {exit !(r >= 1.92)}'; then
  echo "target >= 1.92x: MET"
else
  echo "target >= 1.92x: NOT MET"
fi
