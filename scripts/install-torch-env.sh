#!/usr/bin/env bash
# Creates the torch 2.x environment (torch, Lightning, Accelerate, then
# DeepSpeed, from PyPI, pinned in scripts/requirements-torch.txt and
# scripts/requirements-deepspeed.txt) at $DDP_TORCH_ENV (default
# /opt/ddprun-torch), with Debian's python3. Idempotent: a stamp holding the
# requirements files' hash skips the install while it matches, so every clone
# on this machine shares one environment of several GB.
#   install-torch-env.sh           install unless up to date
#   install-torch-env.sh --check   exit 0 when up to date, 1 when not (installs nothing)
set -euo pipefail
cd "$(dirname "$0")/.."
ENV_DIR=${DDP_TORCH_ENV:-/opt/ddprun-torch}
REQUIREMENTS=scripts/requirements-torch.txt
REQUIREMENTS_DS=scripts/requirements-deepspeed.txt
STAMP="$ENV_DIR/.ddprun-requirements.sha256"
want=$(cat "$REQUIREMENTS" "$REQUIREMENTS_DS" | sha256sum | cut -d' ' -f1)
up_to_date() { [[ -x $ENV_DIR/bin/python && -f $STAMP && $(cat "$STAMP") == "$want" ]]; }
if [[ ${1:-} == --check ]]; then
  up_to_date
  exit
fi
if up_to_date; then
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
echo "install-torch-env: done ($("$ENV_DIR/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
