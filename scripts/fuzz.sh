#!/usr/bin/env bash
# Builds the fuzz targets under fuzz/ with clang (libFuzzer, AddressSanitizer,
# UndefinedBehaviorSanitizer) and runs each for SECONDS (default 300) from its
# committed seed corpus. New inputs go to the build folder, not the repository;
# a crash leaves its input there (crash-*) and fails the script.
# Usage: scripts/fuzz.sh [SECONDS]     (CI runs it for 45 s as a ctest test)
# Exit 77 (a skip, for ctest) when clang++ or libFuzzer is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_SECONDS=${1:-300}
OUT=${FUZZ_BUILD_DIR:-build-fuzz}
CXX=${FUZZ_CXX:-clang++}
if ! command -v "$CXX" >/dev/null; then
  echo "skipped: $CXX missing (scripts/install-deps.sh installs clang and libclang-rt-14-dev)"
  exit 77
fi
mkdir -p "$OUT"
probe="$OUT/probe.cc"
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' >"$probe"
if ! "$CXX" -fsanitize=fuzzer "$probe" -o "$OUT/probe" 2>/dev/null; then
  echo "skipped: $CXX cannot link libFuzzer (install libclang-rt-14-dev)"
  exit 77
fi
flags=(-std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -Ilauncher -Icommon/include)
echo "fuzz: building rendezvous_state_fuzz"
"$CXX" "${flags[@]}" fuzz/rendezvous_state_fuzz.cc launcher/rendezvous_state.cc -o "$OUT/rendezvous_state_fuzz"
# The committed seeds (a minimized corpus, one archive) are unpacked beside
# the folder that takes new inputs; only the latter is written to.
mkdir -p "$OUT/corpus/rendezvous_state" "$OUT/seeds"
tar -xzf fuzz/rendezvous_state_seeds.tar.gz -C "$OUT/seeds"
echo "fuzz: running rendezvous_state_fuzz for $RUN_SECONDS s"
(cd "$OUT" && ./rendezvous_state_fuzz -max_total_time="$RUN_SECONDS" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 corpus/rendezvous_state seeds/rendezvous_state 2>&1 | tail -n 8)
