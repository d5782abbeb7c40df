#!/usr/bin/env bash
# The demo: installs missing dependencies, builds, and trains the reference MLP
# (examples/train) with 4 workers under ddprun: about 10 s on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps-present.sh
BUILD_DIR=${BUILD_DIR:-build}
log=$(mktemp)
build_log=$(mktemp)
trap 'rm -f "$log" "$build_log"' EXIT
# The first build takes several minutes on 2 cores: one line says what is
# happening, with the build's own percentage (redrawn on a terminal, every
# 10% otherwise); the whole log is shown only if the build fails.
echo "building ddprun, libddp and the trainer in $BUILD_DIR/ (the first build takes a few minutes)"
if ! ./scripts/build.sh 2>&1 | tee "$build_log" |
  awk -v tty="$([[ -t 1 ]] && echo 1 || echo 0)" '
    match($0, /^\[ *[0-9]+%\]/) {
      pct = substr($0, RSTART + 1, RLENGTH - 3) + 0
      if (tty) { printf "\r  %3d%% built", pct; fflush() }
      else if (pct >= next_step) { printf "  %3d%% built\n", pct; next_step = pct - pct % 10 + 10; fflush() }
    }
    END { if (tty) printf "\n" }'; then
  echo "the build failed; its last lines:" >&2
  tail -40 "$build_log" >&2
  exit 1
fi
ARGS=(--hidden 256 --layers 3 --epochs 10 --batch_size 32 --log_every 64)
echo "+ ddprun --nproc_per_node=4 $BUILD_DIR/examples/train ${ARGS[*]}"
"$BUILD_DIR/launcher/ddprun" --nproc_per_node=4 "$BUILD_DIR/examples/train" "${ARGS[@]}" | tee "$log"
losses=$(sed -n 's/^\[rank 0\] step \([0-9]*\)\/[0-9]* .*| loss \([0-9.]*\) .*/\1 \2/p' "$log")
read -r first_step first_loss <<<"$(head -1 <<<"$losses")"
read -r last_step last_loss <<<"$(tail -1 <<<"$losses")"
echo "loss: ${first_loss} at step ${first_step} -> ${last_loss} at step ${last_step} (4 ranks, global batch 128)"
