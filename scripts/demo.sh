#!/usr/bin/env bash
# The demo: installs missing dependencies, builds, and trains the reference MLP
# (worker/examples/train) with 4 workers under ddprun: about 10 s on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps-present.sh
./scripts/build.sh >/dev/null
BUILD_DIR=${BUILD_DIR:-build}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
ARGS=(--hidden 256 --layers 3 --epochs 10 --batch_size 32 --log_every 64)
echo "+ ddprun --nproc_per_node=4 $BUILD_DIR/worker/examples/train ${ARGS[*]}"
"$BUILD_DIR/launcher/ddprun" --nproc_per_node=4 "$BUILD_DIR/worker/examples/train" "${ARGS[@]}" | tee "$log"
losses=$(sed -n 's/^\[rank 0\] step \([0-9]*\)\/[0-9]* .*| loss \([0-9.]*\) .*/\1 \2/p' "$log")
read -r first_step first_loss <<<"$(head -1 <<<"$losses")"
read -r last_step last_loss <<<"$(tail -1 <<<"$losses")"
echo "loss: ${first_loss} at step ${first_step} -> ${last_loss} at step ${last_step} (4 ranks, global batch 128)"
