#!/usr/bin/env bash
# torch's own distributed test suite (in the torch wheel) on torch's Gloo and
# on the "ddp" backend, the whole of it, then the comparison: every test
# that passed on Gloo and not on ddp, with the reason (tests/torch/).
# About 6 s a test on two cores; an hour or so for both.
#   scripts/torch-suite.sh [BUILD_DIR] [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
OUT=${2:-$BUILD/torch-suite}
PY=${DDP_TORCH_PYTHON:-/opt/ddprun-torch/bin/python}
mkdir -p "$OUT"
for backend in gloo ddp; do
  PYTHONPATH="$BUILD/python" OMP_NUM_THREADS=1 "$PY" tests/torch/dist_suite.py \
    --backend "$backend" --json "$OUT/$backend.json" >"$OUT/$backend.log" 2>&1 || true
  tail -1 "$OUT/$backend.log"
done
"$PY" tests/torch/compare_suites.py "$OUT/gloo.json" "$OUT/ddp.json"
