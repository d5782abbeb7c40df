#!/usr/bin/env bash
# Configures and builds ddprun into ./build (or $BUILD_DIR). Used by test.sh, demo.sh, bench.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
extra=()
if [[ ${DDP_SANITIZE:-0} == 1 ]]; then
  # AddressSanitizer + UndefinedBehaviorSanitizer for everything built here.
  san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
  extra+=("-DCMAKE_C_FLAGS=$san" "-DCMAKE_CXX_FLAGS=$san" "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined"
          "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address,undefined")
fi
# Ninja where it is installed (scripts/install-deps.sh installs it): it keeps
# every core busy across targets. A folder already configured keeps its generator.
if [[ ! -f $BUILD_DIR/CMakeCache.txt ]] && command -v ninja >/dev/null; then extra+=(-G Ninja); fi
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} "${extra[@]}" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
