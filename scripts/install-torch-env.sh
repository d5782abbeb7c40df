#!/usr/bin/env bash
# Creates the torch 2.x environment (torch, Lightning, Accelerate, then
# DeepSpeed, from PyPI, pinned in scripts/requirements-torch.txt and
# scripts/requirements-deepspeed.txt; then torchft, the benchmark's peer,
# scripts/requirements-torchft.txt) at $DDP_TORCH_ENV (default
# /opt/ddprun-torch), with Debian's python3. Idempotent: a stamp holding the
# first two files' hash skips the torch install while it matches, so every
# clone on this machine shares one environment of several GB; torchft is
# added in place when its pinned versions are missing, and DeepSpeed's
# shared-memory op is compiled once per user. Last, this checkout's own
# package goes in (`pip install --no-build-isolation .`: the ddprun command,
# libddp and ddprun.torch, the c10d backend "ddp", built for this torch,
# with scikit-build-core from scripts/requirements-build.txt), again
# whenever the checkout's commit differs from the one installed.
#   install-torch-env.sh           install unless up to date
#   install-torch-env.sh --check   exit 0 when up to date, 1 when not (installs nothing)
set -euo pipefail
cd "$(dirname "$0")/.."
ENV_DIR=${DDP_TORCH_ENV:-/opt/ddprun-torch}
REQUIREMENTS=scripts/requirements-torch.txt
REQUIREMENTS_DS=scripts/requirements-deepspeed.txt
REQUIREMENTS_FT=scripts/requirements-torchft.txt
REQUIREMENTS_BUILD=scripts/requirements-build.txt
PACKAGE_STAMP="$ENV_DIR/.ddprun-package.commit"
STAMP="$ENV_DIR/.ddprun-requirements.sha256"
want=$(cat "$REQUIREMENTS" "$REQUIREMENTS_DS" | sha256sum | cut -d' ' -f1)
up_to_date() { [[ -x $ENV_DIR/bin/python && -f $STAMP && $(cat "$STAMP") == "$want" ]]; }
# torchft (the benchmark's peer) goes in after torch, in place: a few MB.
pinned_present() {
  "$ENV_DIR/bin/python" -c 'import importlib.metadata as m, sys
want = [l.split("==") for l in open(sys.argv[1]) if "==" in l]
sys.exit(any(m.version(n) != v.strip() for n, v in want))' "$1" 2>/dev/null
}
torchft_present() { pinned_present "$REQUIREMENTS_FT"; }
# The checkout's commit ("" outside git: then always reinstalled).
checkout_commit() { git rev-parse HEAD 2>/dev/null || true; }
package_present() {
  [[ -n $(checkout_commit) && -f $PACKAGE_STAMP && $(cat "$PACKAGE_STAMP") == "$(checkout_commit)" ]] &&
    "$ENV_DIR/bin/python" -c 'import ddprun.torch' 2>/dev/null
}
install_package() {
  package_present && return
  pinned_present "$REQUIREMENTS_BUILD" ||
    "$ENV_DIR/bin/python" -m pip install -q --disable-pip-version-check -r "$REQUIREMENTS_BUILD"
  echo "install-torch-env: building and installing this checkout's ddprun package into $ENV_DIR (pip install --no-build-isolation .)"
  "$ENV_DIR/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps .
  "$ENV_DIR/bin/python" -c 'import ddprun.torch'
  checkout_commit >"$PACKAGE_STAMP"
}
install_torchft() {
  torchft_present && return
  echo "install-torch-env: installing $(grep -v '^#' "$REQUIREMENTS_FT" | xargs) into $ENV_DIR"
  "$ENV_DIR/bin/python" -m pip install -q --disable-pip-version-check -r "$REQUIREMENTS_FT"
  "$ENV_DIR/bin/python" -c 'import torchft'
}
# DeepSpeed compiles its shared-memory op (deepspeed_shm_comm) the first time
# a CPU group starts, into the user's torch extensions cache: minutes on two
# cores. Built here, once, rather than inside a test's time limit.
ds_op_built() {
  compgen -G "${TORCH_EXTENSIONS_DIR:-$HOME/.cache/torch_extensions}/*/deepspeed_shm_comm/deepspeed_shm_comm.so" >/dev/null
}
build_ds_op() {
  ds_op_built && return
  echo "install-torch-env: building DeepSpeed's deepspeed_shm_comm op (once per user, a few minutes)"
  DS_ACCELERATOR=cpu "$ENV_DIR/bin/python" -c 'from deepspeed.comm.torch import build_shm_op; build_shm_op()' >/dev/null
}
if [[ ${1:-} == --check ]]; then
  up_to_date && torchft_present && ds_op_built && package_present
  exit
fi
if up_to_date; then
  install_torchft
  build_ds_op
  install_package
  echo "install-torch-env: $ENV_DIR is up to date"
  exit 0
fi
echo "install-torch-env: installing $(grep -hv '^#' "$REQUIREMENTS" "$REQUIREMENTS_DS" | xargs) into $ENV_DIR (several GB, a few minutes)"
rm -rf "$ENV_DIR"
/usr/bin/python3 -m venv "$ENV_DIR"
"$ENV_DIR/bin/python" -m pip install -q --disable-pip-version-check -r "$REQUIREMENTS"
# DeepSpeed's setup.py imports torch: built against the torch just installed.
DS_BUILD_OPS=0 "$ENV_DIR/bin/python" -m pip install -q --disable-pip-version-check \
  --no-build-isolation -r "$REQUIREMENTS_DS"
# Fails the install if anything is missing.
DS_ACCELERATOR=cpu "$ENV_DIR/bin/python" -c 'import torch, lightning, accelerate, deepspeed'
echo "$want" >"$STAMP"
install_torchft
build_ds_op
install_package
echo "install-torch-env: done ($("$ENV_DIR/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
