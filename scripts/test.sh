#!/usr/bin/env bash
# The test command: installs missing dependencies, configures, builds, runs every test with ctest.
# `scripts/test.sh --sanitize [CTEST ARGS]` does the same in build-asan/ with
# AddressSanitizer and UndefinedBehaviorSanitizer (slower; not part of CI).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ${1:-} == --sanitize ]]; then
  shift
  export DDP_SANITIZE=1 BUILD_DIR=${BUILD_DIR:-build-asan}
  # Python workers load libddp after the interpreter started (ASan is then
  # not first in the library list); leaks at exit are gRPC's own singletons.
  export ASAN_OPTIONS=${ASAN_OPTIONS:-verify_asan_link_order=0:detect_leaks=0}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
fi
./scripts/deps-present.sh
./scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --timeout 300 -j "${CTEST_JOBS:-2}" "$@"
