#!/usr/bin/env bash
# Scaling of the reference trainer on this machine: training throughput
# (samples/s, steady state) with 2 ranks against 1 rank, one thread per rank.
#
#   bash bench/train_scaling.sh [BUILD_DIR=build-release] [REPS=5]
#
# Model: the shape of bench/peers/ddp_step.py (torch DDP's figure):
# 1024 inputs, 3 hidden layers of 1024, 10 classes = 3x Linear(1024,1024) +
# Linear(1024,10), 3,159,050 parameters (12.6 MB of float32 gradients); batch
# 64 per rank (the global batch grows with the ranks, as in weak scaling);
# SGD with momentum; DDP_BACKEND (default shm; gloo to compare); BUCKET_MB MiB
# buckets (default 25, torch DDP's default). Each repetition runs, back to
# back (so every ratio compares runs a few seconds apart):
#   1 rank      ddprun --nproc_per_node=1 train ...
#   2 ranks     ddprun --nproc_per_node=2 train ...   (defaults: GradSync's
#               all-reduces on a communication thread beside the backward pass)
#   2 inline    the same with --comm_mode inline (the all-reduces on the
#               compute thread, between layers)
#   2 sharded   the same with --shard_optimizer (ZeRO: each rank reduces
#               and updates only its half of the gradients and parameters;
#               with shm one node-wide copy of the parameters, so nothing is
#               gathered; the same losses to the last digit)
#   2 shard+inl --shard_optimizer --comm_mode inline
#   2 shared    --comm_mode shared (GradSync's shared sum: no all-reduce,
#               the ranks add their gradients into one node-shared buffer)
#   2 shared+sh --comm_mode shared --shard_optimizer
#   ceiling     two independent 1-rank trainers at once (no communication):
#               what two processes sharing this machine reach by themselves
# and the ratios to 1 rank. ONLY="shared" (names, space-separated) runs just
# those 2-rank configurations (with 1 rank and the ceiling), for longer series. Figures are medians over the repetitions (the two
# cores are shared with everything else, so single runs vary by +-15% and
# more). Target: 2 ranks at 1.95x or more.
set -euo pipefail
BUILD_DIR=${1:-build-release}
REPS=${2:-5}
STEPS=${STEPS:-60}
DDPRUN="$BUILD_DIR/launcher/ddprun"
TRAIN="$BUILD_DIR/examples/train"
ARGS=(--input_dim 1024 --hidden 1024 --layers 3 --output_dim 10 --task classification
      --batch_size 64 --steps "$STEPS" --log_every 100000 --dataset_size 8192
      --optimizer sgd --lr 0.01 --momentum 0.9 --bucket_cap_mb "${BUCKET_MB:-25}")
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 DDP_BACKEND=${DDP_BACKEND:-shm}

steady() { sed -n 's/.*steady \([0-9]*\) samples\/s.*/\1/p'; }
median() { sort -n | awk '{v[NR]=$1} END {if (NR % 2) print v[(NR+1)/2]; else printf "%.0f\n", (v[NR/2]+v[NR/2+1])/2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }

# name: extra train flags for a 2-rank configuration
CONFIGS=("2 ranks:" "2 inline:--comm_mode inline" "2 sharded:--shard_optimizer"
         "2 shard+inl:--shard_optimizer --comm_mode inline"
         "2 shared:--comm_mode shared" "2 shared+sh:--comm_mode shared --shard_optimizer")
if [ -n "${ONLY:-}" ]; then
  chosen=()
  for config in "${CONFIGS[@]}"; do
    name=${config%%:*}
    for wanted in $ONLY; do [ "$name" = "2 $wanted" ] && chosen+=("$config"); done
  done
  if [ ${#chosen[@]} -eq 0 ]; then
    names=$(for config in "${CONFIGS[@]}"; do name=${config%%:*}; printf " %s" "${name#2 }"; done)
    echo "train_scaling.sh: ONLY=$ONLY names none of:$names" >&2
    exit 2
  fi
  CONFIGS=("${chosen[@]}")
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf "# train: %s, batch 64 per rank, %s steps (steady = after the first 6), %s repetitions, DDP_BACKEND=%s, %s MiB buckets\n" \
  "MLP 1024-1024-1024-1024-10 (3159050 parameters)" "$STEPS" "$REPS" "$DDP_BACKEND" "${BUCKET_MB:-25}"
printf "%6s %10s" rep "1 rank"
for config in "${CONFIGS[@]}"; do printf " %10s" "${config%%:*}"; done
printf " %10s |" ceiling
for config in "${CONFIGS[@]}"; do printf " %10s" "${config%%:*}"; done
printf " %10s\n" ceiling
for rep in $(seq 1 "$REPS"); do
  one=$("$DDPRUN" --nproc_per_node=1 --no_prefix "$TRAIN" "${ARGS[@]}" 2>/dev/null | steady)
  echo "$one" >>"$tmp/c0.all"
  line=$(printf "%6s %10s" "$rep" "$one")
  ratios=""
  i=0
  for config in "${CONFIGS[@]}"; do
    i=$((i + 1))
    # shellcheck disable=SC2086 # the flags split into words on purpose
    "$DDPRUN" --nproc_per_node=2 --no_prefix "$TRAIN" "${ARGS[@]}" ${config#*:} >"$tmp/run$i.txt" 2>/dev/null
    value=$(steady <"$tmp/run$i.txt")
    echo "$value" >>"$tmp/c$i.all"
    ratio "$value" "$one" >>"$tmp/r$i.all" && echo >>"$tmp/r$i.all"
    line+=$(printf " %10s" "$value")
    ratios+=$(printf " %9sx" "$(ratio "$value" "$one")")
  done
  "$TRAIN" "${ARGS[@]}" >"$tmp/a.txt" 2>/dev/null &
  a=$!
  "$TRAIN" "${ARGS[@]}" >"$tmp/b.txt" 2>/dev/null
  wait "$a"
  ceiling=$(( $(steady <"$tmp/a.txt") + $(steady <"$tmp/b.txt") ))
  echo "$ceiling" >>"$tmp/ceiling.all"
  echo "$line $(printf " %10s" "$ceiling") |$ratios $(printf " %9sx" "$(ratio "$ceiling" "$one")")"
done
one=$(median <"$tmp/c0.all")
line=$(printf "%6s %10s" median "$one")
ratios=""
declare -a medians
i=0
for config in "${CONFIGS[@]}"; do
  i=$((i + 1))
  medians[$i]=$(median <"$tmp/c$i.all")
  line+=$(printf " %10s" "${medians[$i]}")
  ratios+=$(printf " %9sx" "$(ratio "${medians[$i]}" "$one")")
done
ceiling=$(median <"$tmp/ceiling.all")
echo "$line $(printf " %10s" "$ceiling") |$ratios $(printf " %9sx" "$(ratio "$ceiling" "$one")")"
echo "last runs' GradSync figures:"
i=0
for config in "${CONFIGS[@]}"; do
  i=$((i + 1))
  grep -h "summary: gradient sync" "$tmp/run$i.txt" | sed "s/^/  ${config%%:*}: /"
done
loss() { sed -n 's/.*final loss \([^ ]*\).*/\1/p' "$1"; }
if [ -z "${ONLY:-}" ]; then  # the run numbers below are those of the full set
  if [ "$(loss "$tmp/run1.txt")" = "$(loss "$tmp/run3.txt")" ]; then
    echo "plain and sharded runs end with the same loss: yes ($(loss "$tmp/run1.txt"))"
  else
    echo "plain and sharded runs end with the same loss: NO ($(loss "$tmp/run1.txt") vs $(loss "$tmp/run3.txt"))"
  fi
  echo "plain and shared-sum final losses: $(loss "$tmp/run1.txt") and $(loss "$tmp/run5.txt") (the same sums in another order)"
fi
i=0
for config in "${CONFIGS[@]}"; do
  i=$((i + 1))
  r=$(ratio "${medians[$i]}" "$one")
  # Also the median of the repetitions' own ratios (each 2-rank run against
  # the 1-rank run just before it), which a stretch of slow 1-rank runs moves less.
  per_rep=$(sort -n "$tmp/r$i.all" | awk '{v[NR]=$1} END {if (NR % 2) printf "%.3f", v[(NR+1)/2]; else printf "%.3f", (v[NR/2]+v[NR/2+1])/2}')
  for target in 1.92 1.95; do
    if awk -v r="$r" -v t="$target" 'BEGIN {exit !(r >= t)}'; then verdict=MET; else verdict="NOT MET"; fi
    echo "${config%%:*} vs 1 rank: ${r}x (median of the repetitions' ratios ${per_rep}x), target >= ${target}x: $verdict"
  done
done
echo "machine ceiling without communication: $(ratio "$ceiling" "$one")x"
