#!/usr/bin/env bash
# The demo: installs missing dependencies, builds, and runs a 4-worker job with ddprun.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps-present.sh
./scripts/build.sh >/dev/null
BUILD_DIR=${BUILD_DIR:-build}
echo "+ ddprun --nproc_per_node=4 hello_worker"
"$BUILD_DIR/launcher/ddprun" --nproc_per_node=4 "$BUILD_DIR/worker/examples/hello_worker"
