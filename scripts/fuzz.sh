#!/usr/bin/env bash
# Builds the fuzz targets under fuzz/ with clang (libFuzzer, AddressSanitizer,
# UndefinedBehaviorSanitizer) and runs each from its committed seed corpus:
#   rendezvous_state_fuzz    RendezvousState driven directly by sequences of
#                            requests, its invariants checked after each;
#   rendezvous_service_fuzz  the gRPC RendezvousService on an in-process
#                            server, fed sequences of calls whose requests are
#                            raw bytes (the server decodes arbitrary, often
#                            invalid, protobuf) or built messages with right and
#                            wrong tokens; checks that wrong callers are refused
#                            and that the server still serves after each input.
# SECONDS (default 300) is split between them: 55% to the state, 45% to the
# service (CI's 45 s: 25 s + 20 s). With TARGET (state or service) only that
# one is built and run, for all of SECONDS. New inputs go to the build folder,
# not the repository; a crash leaves its input there (crash-*) and fails the
# script (exit 1: libFuzzer's default of 77 would read as a skip).
# FUZZ_OPT (default -O1) is the optimization of the instrumented code; ctest
# builds the service at -O0 (half the build time; its inputs run mostly in gRPC).
# Usage: scripts/fuzz.sh [SECONDS [TARGET]]   (ctest runs 30 state and 30 service)
# Exit 77 (a skip, for ctest) when clang++ or libFuzzer is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_SECONDS=${1:-300}
TARGET=${2:-all}
case "$TARGET" in
  all) STATE_SECONDS=$((RUN_SECONDS * 55 / 100)); SERVICE_SECONDS=$((RUN_SECONDS - STATE_SECONDS)) ;;
  state) STATE_SECONDS=$RUN_SECONDS; SERVICE_SECONDS=0 ;;
  service) STATE_SECONDS=0; SERVICE_SECONDS=$RUN_SECONDS ;;
  *) echo "usage: scripts/fuzz.sh [SECONDS [all|state|service]]" >&2; exit 2 ;;
esac
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
flags=(-std=c++20 -g "${FUZZ_OPT:--O1}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -Ilauncher -Icommon/include)
mkdir -p "$OUT/seeds"
# The committed seeds (a minimized corpus, one archive per target) are
# unpacked beside the folder that takes new inputs; only the latter is written to.
if ((STATE_SECONDS > 0)); then
  echo "fuzz: building rendezvous_state_fuzz"
  "$CXX" "${flags[@]}" fuzz/rendezvous_state_fuzz.cc launcher/rendezvous/*.cc -o "$OUT/rendezvous_state_fuzz"
  mkdir -p "$OUT/corpus/rendezvous_state"
  tar -xzf fuzz/rendezvous_state_seeds.tar.gz -C "$OUT/seeds"
  echo "fuzz: running rendezvous_state_fuzz for $STATE_SECONDS s"
  (cd "$OUT" && ./rendezvous_state_fuzz -max_total_time="$STATE_SECONDS" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -error_exitcode=1 \
    -print_final_stats=1 corpus/rendezvous_state seeds/rendezvous_state 2>&1 | tail -n 8)
fi
if ((SERVICE_SECONDS > 0)); then
  # The service target links gRPC and protobuf (uninstrumented system
  # libraries; the generated message code and ours are instrumented).
  if ! command -v protoc >/dev/null || ! command -v grpc_cpp_plugin >/dev/null || ! pkg-config --exists grpc++ protobuf spdlog; then
    echo "skipped: rendezvous_service_fuzz needs protoc, grpc_cpp_plugin and the gRPC, protobuf and spdlog development files"
    exit 77
  fi
  echo "fuzz: building rendezvous_service_fuzz"
  mkdir -p "$OUT/gen" "$OUT/obj"
  protoc --proto_path=proto --cpp_out="$OUT/gen" --grpc_out="$OUT/gen" \
    --plugin=protoc-gen-grpc="$(command -v grpc_cpp_plugin)" proto/ddp/v1/rendezvous.proto
  read -r -a dep_cflags <<<"$(pkg-config --cflags grpc++ protobuf spdlog)"
  read -r -a dep_libs <<<"$(pkg-config --libs grpc++ protobuf spdlog)"
  # What the service links and nothing more (each file costs seconds under the
  # sanitizers; the torch store's TCP server is not part of the service). It
  # judges stragglers across nodes from the reports it keeps.
  service_sources=(fuzz/rendezvous_service_fuzz.cc launcher/rpc/rendezvous_service*.cc launcher/rendezvous/*.cc
                   common/src/endpoint.cc common/src/launcher_log.cc
                   launcher/rpc/status_proto.cc launcher/observe/job_status.cc
                   launcher/observe/node_straggler_detector.cc launcher/observe/straggler_judge.cc
                   "$OUT/gen/ddp/v1/rendezvous.pb.cc" "$OUT/gen/ddp/v1/rendezvous.grpc.pb.cc")
  objects=()
  for src in "${service_sources[@]}"; do objects+=("$OUT/obj/$(basename "$src" .cc).o"); done
  # One compiler per core (xargs exits non-zero when any of them fails).
  printf '%s\n' "${service_sources[@]}" |
    OBJ_DIR="$OUT/obj" xargs -P "$(nproc)" -I{} bash -c \
      'src=$1; shift; exec "$@" -c "$src" -o "$OBJ_DIR/$(basename "$src" .cc).o"' _ {} \
      "$CXX" "${flags[@]}" -isystem "$OUT/gen" "${dep_cflags[@]}"
  "$CXX" "${flags[@]}" "${objects[@]}" "${dep_libs[@]}" -o "$OUT/rendezvous_service_fuzz"
  mkdir -p "$OUT/corpus/rendezvous_service"
  tar -xzf fuzz/rendezvous_service_seeds.tar.gz -C "$OUT/seeds"
  echo "fuzz: running rendezvous_service_fuzz for $SERVICE_SECONDS s"
  # gRPC's threads and caches outlive an input: leak checks off (ASan still
  # reports use-after-free, overflows and the rest).
  (cd "$OUT" && ./rendezvous_service_fuzz -max_total_time="$SERVICE_SECONDS" -max_len=4096 -timeout=20 \
    -rss_limit_mb=4096 -error_exitcode=1 -detect_leaks=0 -print_final_stats=1 corpus/rendezvous_service seeds/rendezvous_service 2>&1 | tail -n 8)
fi
