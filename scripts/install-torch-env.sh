#!/usr/bin/env bash
# Creates the torch 2.x environment (torch, Lightning, Accelerate from PyPI,
# pinned in scripts/requirements-torch.txt) at $DDP_TORCH_ENV
# (default /opt/ddprun-torch), with Debian's python3. Idempotent: a stamp
# holding the requirements file's hash skips the install while it matches, so
# every clone on this machine shares one environment of several GB.
set -euo pipefail
cd "$(dirname "$0")/.."
ENV_DIR=${DDP_TORCH_ENV:-/opt/ddprun-torch}
REQUIREMENTS=scripts/requirements-torch.txt
STAMP="$ENV_DIR/.ddprun-requirements.sha256"
want=$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)
if [[ -x $ENV_DIR/bin/python && -f $STAMP && $(cat "$STAMP") == "$want" ]]; then
  echo "install-torch-env: $ENV_DIR is up to date"
  exit 0
fi
echo "install-torch-env: installing $(grep -v '^#' "$REQUIREMENTS" | xargs) into $ENV_DIR (several GB, a few minutes)"
rm -rf "$ENV_DIR"
/usr/bin/python3 -m venv "$ENV_DIR"
"$ENV_DIR/bin/python" -m pip install -q --disable-pip-version-check -r "$REQUIREMENTS"
"$ENV_DIR/bin/python" -c 'import torch, lightning, accelerate' # fails the install if anything is missing
echo "$want" >"$STAMP"
echo "install-torch-env: done ($("$ENV_DIR/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
