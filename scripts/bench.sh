#!/usr/bin/env bash
# Builds (Release) and prints every benchmark table (docs/PERFORMANCE.md).
# PEERS=1 also runs the peer measurements (torchrun, torch over Gloo, OpenMPI: bench/peers/run_all.sh) after them.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps-present.sh
BUILD_DIR=${BUILD_DIR:-build-release} BUILD_TYPE=Release ./scripts/build.sh >/dev/null
echo "== launch overhead (bench/launch_overhead.sh) =="
bash bench/launch_overhead.sh "${BUILD_DIR:-build-release}" "${RUNS:-20}"
echo "== restart after a worker failure (bench/restart_latency.sh: 4 workers, one fails once, ddprun vs torchrun 2.x) =="
bash bench/restart_latency.sh "${BUILD_DIR:-build-release}" "${RUNS_RESTART:-7}"
echo "== multi-host launch (bench/multihost_launch.sh: 2 namespace hosts x 4 workers, ddprun vs torchrun 2.x, c10d and static forms) =="
if [ "$(id -u)" = 0 ]; then
  bash bench/multihost_launch.sh "${BUILD_DIR:-build-release}" "${RUNS_MULTIHOST:-5}"
else
  echo "skipped: needs root for network namespaces"
fi
echo "== launch under Slurm (bench/slurm_launch_bench: a 2-node test cluster, 2 workers per node, vs bare srun and torchrun) =="
"${BUILD_DIR:-build-release}/bench/slurm_launch_bench" "${BUILD_DIR:-build-release}/launcher/ddprun" "${RUNS_SLURM:-7}"
echo "== rendezvous (bench/rdzv_bench) =="
"${BUILD_DIR:-build-release}/bench/rdzv_bench"
echo "== ddprun status for 1,024 ranks (bench/status_bench: 128 simulated agents x 8 ranks) =="
"${BUILD_DIR:-build-release}/bench/status_bench" "${BUILD_DIR:-build-release}/launcher/ddprun"
B="${BUILD_DIR:-build-release}"
echo "== libddp all_reduce sweep (bench/allreduce_bench): shm with allocated and private buffers, then gloo =="
for n in 2 4; do
  for buffers in allocated private; do
    DDP_BACKEND=shm "$B/launcher/ddprun" --nproc_per_node=$n --no_prefix \
      "$B/bench/allreduce_bench" --trials "${TRIALS:-5}" --buffers "$buffers" 2>/dev/null
  done
  if [ "$n" -gt "$(nproc)" ]; then
    echo "-- the same with more ranks than cores, each rank bound to one core in turn (ddprun --bind_cores_to_rank) --"
    for buffers in allocated private; do
      DDP_BACKEND=shm "$B/launcher/ddprun" --nproc_per_node=$n --bind_cores_to_rank --no_prefix \
        "$B/bench/allreduce_bench" --trials "${TRIALS:-5}" --buffers "$buffers" 2>/dev/null
    done
  fi
  DDP_BACKEND=gloo "$B/launcher/ddprun" --nproc_per_node=$n --no_prefix \
    "$B/bench/allreduce_bench" --trials "${TRIALS:-5}" 2>/dev/null
done
echo "-- shm, 2 ranks, every input rewritten by its rank before each call (--fresh: the data leaves the writer's cache, as gradients must) --"
for buffers in allocated private; do
  DDP_BACKEND=shm "$B/launcher/ddprun" --nproc_per_node=2 --no_prefix \
    "$B/bench/allreduce_bench" --trials "${TRIALS:-5}" --buffers "$buffers" --fresh --min 4096 2>/dev/null
done
echo "== shm all_reduce variants side by side (bench/allreduce_bench --algo all: busbw of auto, push, pull, chunked, small, one group each), allocated buffers, 2 and 4 ranks =="
for n in 2 4; do
  DDP_BACKEND=shm "$B/launcher/ddprun" --nproc_per_node=$n --no_prefix \
    "$B/bench/allreduce_bench" --trials "${TRIALS_ALGO:-3}" --algo all --min 65536 --max 67108864 2>/dev/null
  if [ "$n" -gt "$(nproc)" ]; then
    echo "-- the same with more ranks than cores, each rank bound to one core in turn (ddprun --bind_cores_to_rank) --"
    DDP_BACKEND=shm "$B/launcher/ddprun" --nproc_per_node=$n --bind_cores_to_rank --no_prefix \
      "$B/bench/allreduce_bench" --trials "${TRIALS_ALGO:-3}" --algo all --min 65536 --max 67108864 2>/dev/null
  fi
done
echo "== reduce_scatter and all_gather (bench/allreduce_bench --collective), 2 ranks: shm allocated, shm private, gloo =="
for collective in reduce_scatter all_gather; do
  for buffers in allocated private; do
    DDP_BACKEND=shm "$B/launcher/ddprun" --nproc_per_node=2 --no_prefix \
      "$B/bench/allreduce_bench" --trials "${TRIALS:-5}" --collective "$collective" --buffers "$buffers" --min 4096 2>/dev/null
  done
  DDP_BACKEND=gloo "$B/launcher/ddprun" --nproc_per_node=2 --no_prefix \
    "$B/bench/allreduce_bench" --trials "${TRIALS:-5}" --collective "$collective" --min 4096 --max 67108864 2>/dev/null
done
echo "== gradient sync (bench/gradsync_bench: GradSync on a 3.2M-parameter MLP step, 1 and 2 ranks; shm, then gloo) =="
for backend in shm gloo; do
  for n in 1 2; do
    echo "-- ${n} rank(s), DDP_BACKEND=${backend} --"
    DDP_BACKEND=$backend OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 \
      "$B/launcher/ddprun" --nproc_per_node="$n" --no-prefix "$B/bench/gradsync_bench"
  done
done
echo "== reference trainer scaling (bench/train_scaling.sh: 2 ranks vs 1, 3.16M-parameter MLP, batch 64 per rank, 1 thread per rank) =="
bash bench/train_scaling.sh "${BUILD_DIR:-build-release}" "${REPS:-5}"
if [ "${PEERS:-0}" = 1 ]; then
  echo "== peers (bench/peers/run_all.sh: torchrun, torch.distributed over Gloo, OpenMPI, memory bandwidth) =="
  bash bench/peers/run_all.sh
fi
