#!/usr/bin/env bash
# Installs the Debian dependencies when any is missing, and the torch 2.x
# environment when it is missing or older than its requirements (quietly skips otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cmake >/dev/null || ! command -v protoc >/dev/null || ! command -v grpc_cpp_plugin >/dev/null ||
   [[ ! -f /usr/include/CLI/CLI.hpp || ! -d /usr/include/gloo || ! -d /usr/include/spdlog || ! -d /usr/include/gtest ]]; then
  ./scripts/install-deps.sh
elif ! ./scripts/install-torch-env.sh --check; then
  ./scripts/install-torch-env.sh
fi
