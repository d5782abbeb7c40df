#!/usr/bin/env bash
# The test command: installs missing dependencies, configures, builds, runs every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps-present.sh
./scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --timeout 300 -j "${CTEST_JOBS:-2}" "$@"
