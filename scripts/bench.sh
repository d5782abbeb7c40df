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
