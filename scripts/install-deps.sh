#!/usr/bin/env bash
# Installs every Debian package that ddprun's build, tests, demo and benchmarks need,
# then the torch 2.x environment from PyPI (scripts/install-torch-env.sh).
# Idempotent: packages already present are skipped, and `apt-get update` runs at most once.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev libfmt-dev libcli11-dev
  libgtest-dev libgmock-dev googletest
  libgloo-dev
  libopenblas-dev zlib1g-dev
  python3 python3-torch python3-sklearn python3-venv
  openmpi-bin libopenmpi-dev hyperfine
  procps iproute2 elfutils
  openssh-server openssh-client
  slurmctld slurmd slurm-client munge
  clang libclang-rt-14-dev clang-format
  prometheus-cpp-dev prometheus
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  ./scripts/install-torch-env.sh
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Packages with daemons (munge, slurmctld, slurmd) must not start them: the tests
# run their own instances (tests/support/slurm_cluster.cc), and without an init
# system a failed start would fail the install. A policy-rc.d that denies every
# start does that; one already there (as in Docker images) is left alone.
POLICY=/usr/sbin/policy-rc.d
if [[ ! -e $POLICY ]]; then
  printf '#!/bin/sh\n# install-deps.sh: no daemon starts during the install\nexit 101\n' |
    $SUDO tee "$POLICY" >/dev/null
  $SUDO chmod 755 "$POLICY"
  trap '$SUDO rm -f "$POLICY"' EXIT
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
# torch 2.x, Lightning, Accelerate and DeepSpeed from PyPI, outside the checkout.
$SUDO ./scripts/install-torch-env.sh
