#!/usr/bin/env bash
# Builds (Release) and prints every benchmark table. Run ../shared/peers beside it for peer figures.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps-present.sh
BUILD_DIR=${BUILD_DIR:-build-release} BUILD_TYPE=Release ./scripts/build.sh >/dev/null
echo "== launch overhead (bench/launch_overhead.sh) =="
bash bench/launch_overhead.sh "${BUILD_DIR:-build-release}" "${RUNS:-20}"
echo "== rendezvous (bench/rdzv_bench) =="
"${BUILD_DIR:-build-release}/bench/rdzv_bench"
echo "== libddp all_reduce sweep, gloo (bench/allreduce_bench) =="
for n in 2 4; do
  "${BUILD_DIR:-build-release}/launcher/ddprun" --nproc_per_node=$n --no_prefix \
    "${BUILD_DIR:-build-release}/bench/allreduce_bench" --trials "${TRIALS:-5}" 2>/dev/null
done
