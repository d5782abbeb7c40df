#!/usr/bin/env bash
# Builds ddprun in Release with CUDA and NCCL and packs into one folder what a
# machine with a GPU but without this build tree needs to run it: ddprun, its
# rendezvous plugin, libddp, the trainer `train`, the GPU tests, the
# benchmarks, and every shared library they load that such a machine may lack.
#
#   scripts/gpu-bundle.sh [--no-build] [--verify] [DIR]     (DIR: build-gpu-bundle)
#
#   DIR/bin/      ddprun, libddprun_rpc.so (beside ddprun, where it looks for it),
#                 train, allreduce_bench, gradsync_bench, nccl_abort_probe, nccl_tests,
#                 grad_sync_tests, train_integration_tests (and train_fault_worker,
#                 which its restart tests run), heal_train_tests (and
#                 heal_fault_worker), host-python
#   DIR/lib/      libddp.so and the libraries they load (gRPC, protobuf, Gloo,
#                 spdlog, fmt, OpenBLAS, abseil, c-ares, re2, OpenSSL, libcudart, ...)
#   DIR/py/       the PyTorch / Lightning checks (tests/gpu/*.py)
#   DIR/run.sh    runs the GPU checks (gpu-check.sh) from the bundle
#   DIR/env.sh    `source DIR/env.sh`: ddprun from the bundle in this shell
#   DIR/unpack.sh unpacks lib/*.gz (run.sh and env.sh do it too)
#   DIR/host-libs.txt   libraries the binaries load that are NOT carried (too
#                 large): NCCL and cuBLAS; gpu-check.sh finds them on the machine
#   DIR/BUNDLE-INFO     what was built, from which commit, and the sizes
#
# Left out on purpose: glibc (libc, libm, libpthread, libdl, librt, ...), the
# dynamic loader, and the NVIDIA driver's libraries (libcuda, libnvidia-*),
# which belong to the machine. CUDA libraries above HOST_LIB_MIN_MIB (default
# 8 MiB; libnccl is ~210 MiB, libcublasLt ~520 MiB) would not fit the 64 MiB
# limit and are taken from the GPU machine (its CUDA toolkit or PyTorch's
# nvidia-* packages); smaller ones (libcudart) are carried.
#
# Binaries and non-CUDA libraries are stripped (strip --strip-unneeded, on the
# copies). Carried libraries over COMPRESS_MIN_MIB (default 16: Debian's
# OpenBLAS, 36 MiB with the kernels of every x86 CPU) are stored gzipped
# (lib/NAME.gz, 10 MiB) and unpacked beside themselves by DIR/unpack.sh, which
# run.sh and env.sh call: run one of them once before starting
# DIR/bin/ddprun by hand. The script fails if the bundle exceeds 64 MiB (BUNDLE_LIMIT_MIB),
# if a library cannot be resolved, or if a carried binary would load a
# non-system library from outside the bundle.
#
# --verify then proves the bundle on this machine in a clean environment
# (env -i, library path only into the bundle): ddprun + train on 2 ranks, and
# the bundled test binaries (their CPU tests pass, GPU tests skip without a GPU).
# --no-build packs an existing build (BUILD_DIR) without running the build.
#
# Env: BUILD_DIR (default build-release), BUILD_TYPE (default Release), JOBS.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

die() { echo "gpu-bundle: error: $*" >&2; exit 1; }
note() { echo "gpu-bundle: $*"; }

build=1
verify=0
dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) build=0 ;;
    --verify) verify=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) [ -z "$dir" ] || die "one bundle folder only (got '$dir' and '$1')"; dir=$1 ;;
  esac
  shift
done
DIR=${dir:-build-gpu-bundle}
case "$DIR" in /*) ;; *) DIR=$ROOT/$DIR ;; esac
BUILD_DIR=${BUILD_DIR:-build-release}
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR=$ROOT/$BUILD_DIR ;; esac
BUILD_TYPE=${BUILD_TYPE:-Release}
LIMIT_MIB=${BUNDLE_LIMIT_MIB:-64}
LIMIT=$((LIMIT_MIB * 1024 * 1024))
HOST_LIB_MIN=$(( ${HOST_LIB_MIN_MIB:-8} * 1024 * 1024 ))
COMPRESS_MIN=$(( ${COMPRESS_MIN_MIB:-16} * 1024 * 1024 ))

for tool in ldd strip readelf du cp gzip; do
  command -v "$tool" >/dev/null || die "'$tool' is needed and not on PATH"
done

# ------------------------------------------------------------------ build
if [ "$build" = 1 ]; then
  note "building $BUILD_TYPE into $BUILD_DIR"
  BUILD_DIR=$BUILD_DIR BUILD_TYPE=$BUILD_TYPE ./scripts/build.sh
fi
[ -f "$BUILD_DIR/CMakeCache.txt" ] || die "no build in $BUILD_DIR (run without --no-build, or set BUILD_DIR)"
built_type=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$BUILD_DIR/CMakeCache.txt")
[ "$built_type" = Release ] || note "warning: $BUILD_DIR is a '$built_type' build, not Release"

# What goes into bin/ (executables, and the plugin ddprun dlopens from beside itself) and lib/.
BIN_FILES=(launcher/ddprun launcher/libddprun_rpc.so examples/train
           bench/allreduce_bench bench/gradsync_bench bench/nccl_abort_probe
           tests/nccl_tests tests/grad_sync_tests tests/train_integration_tests
           tests/train_fault_worker tests/heal_train_tests tests/heal_fault_worker)
LIB_FILES=(worker/libddp.so)
for f in "${BIN_FILES[@]}" "${LIB_FILES[@]}"; do
  [ -f "$BUILD_DIR/$f" ] || die "$BUILD_DIR/$f is missing: the build did not produce it (is OpenBLAS/GTest/CUDA there?)"
done
ldd "$BUILD_DIR/worker/libddp.so" | grep -q 'libnccl\.so' ||
  die "$BUILD_DIR/worker/libddp.so does not load libnccl: the build has no NCCL backend (CUDA 12+/NCCL under /usr/local/cuda?)"
# train's GPU path loads cuBLAS with dlopen (by soname), so ldd does not show it.
probe=$("$BUILD_DIR/examples/train" --backend nccl --steps 1 2>&1 || true)
case "$probe" in *"has no GPU path"*)
  die "$BUILD_DIR/examples/train was built without its GPU path (nvcc or cuBLAS not found): $probe" ;;
esac
cublas_lib=$(sed -n 's/^CUDA_cublas_LIBRARY:FILEPATH=//p' "$BUILD_DIR/CMakeCache.txt")
[ -n "$cublas_lib" ] && [ -e "$cublas_lib" ] || die "CUDA_cublas_LIBRARY is not set in $BUILD_DIR/CMakeCache.txt"
cublas_soname=$(readelf -d "$cublas_lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ -n "$cublas_soname" ] || die "$cublas_lib has no SONAME"

# ------------------------------------------------------------------ pack
if [ -e "$DIR" ]; then
  if [ -f "$DIR/BUNDLE-INFO" ] || [ -z "$(ls -A "$DIR")" ]; then
    rm -rf "$DIR"
  else
    die "$DIR exists and is not a bundle (no BUNDLE-INFO): not overwriting it"
  fi
fi
mkdir -p "$DIR/bin" "$DIR/lib" "$DIR/py"

for f in "${BIN_FILES[@]}"; do cp -L "$BUILD_DIR/$f" "$DIR/bin/"; done
for f in "${LIB_FILES[@]}"; do cp -L "$BUILD_DIR/$f" "$DIR/lib/"; done
strip --strip-unneeded "$DIR"/bin/* "$DIR"/lib/*

# glibc's own libraries, the loader, and the driver's: the machine's, never carried.
is_system() {
  case "$1" in
    linux-vdso.so.*|ld-linux*.so.*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*) return 0 ;;
    libresolv.so.*|libutil.so.*|libanl.so.*|libnsl.so.*|libmvec.so.*) return 0 ;;
    libcuda.so*|libnvidia-*|libnvcuvid.so*|libnvoptix.so*) return 0 ;;
  esac
  return 1
}
cuda_root=$(readlink -f /usr/local/cuda 2>/dev/null || echo /usr/local/cuda)
is_cuda_lib() {  # a library of the CUDA toolkit (or NCCL installed beside it)
  local real
  real=$(readlink -f "$1")
  case "$real" in /usr/local/cuda*|"$cuda_root"/*) return 0 ;; esac
  case "$(basename "$1")" in libcudart.so*|libnccl.so*|libcublas*.so*) return 0 ;; esac
  return 1
}

declare -A HOST=()   # soname -> "size path" of libraries left to the GPU machine
carry() {  # carry SONAME PATH: copy one library into lib/ (or list it in HOST)
  local soname=$1 path=$2 size
  [ -e "$DIR/lib/$soname" ] && return 0
  [ -n "${HOST[$soname]:-}" ] && return 0
  size=$(stat -L -c %s "$path")
  if is_cuda_lib "$path"; then
    if [ "$size" -gt "$HOST_LIB_MIN" ]; then
      HOST[$soname]="$size $path"
      return 0
    fi
    cp -L "$path" "$DIR/lib/$soname"   # NVIDIA's libraries ship stripped: copied as they are
  else
    cp -L "$path" "$DIR/lib/$soname"   # -L: OpenBLAS is reached through /etc/alternatives links
    strip --strip-unneeded "$DIR/lib/$soname"
  fi
}

# ldd lists the whole closure of a file's dependencies.
collect() {  # collect FILE: carry every library FILE loads
  local line soname path
  while IFS= read -r line; do
    line=${line#"${line%%[![:space:]]*}"}
    case "$line" in
      *"=> not found"*) die "$(basename "$1") needs ${line%% *}, which is not found on this machine" ;;
      *" => "*) soname=${line%% =>*}; path=${line#*=> }; path=${path%% (*} ;;
      /*) path=${line%% (*}; soname=$(basename "$path") ;;
      *) continue ;;
    esac
    is_system "$soname" && continue
    [ -n "$path" ] && [ -e "$path" ] || continue
    carry "$soname" "$path"
  done < <(ldd "$1")
}
for f in "${BIN_FILES[@]}" "${LIB_FILES[@]}"; do collect "$BUILD_DIR/$f"; done

# Loaded with dlopen, so ldd does not list them: cuBLAS (train's GPU path).
resolve_soname() {  # the file the loader would give for SONAME here
  local p
  p=$(ldconfig -p 2>/dev/null | awk -v s="$1" '$1 == s && /x86-64/ {print $NF; exit}')
  [ -n "$p" ] && { echo "$p"; return; }
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/$1" ] && { echo "$d/$1"; return; }
  done
  return 1
}
cublas_path=$(resolve_soname "$cublas_soname") || die "train loads $cublas_soname, which is not found on this machine"
carry "$cublas_soname" "$cublas_path"
collect "$cublas_path"

# ------------------------------------------------------------------ scripts
cp scripts/gpu-check.sh "$DIR/gpu-check.sh"
cp tests/gpu/*.py "$DIR/py/"
cp tests/gpu/host-python "$DIR/bin/host-python"
chmod +x "$DIR/gpu-check.sh" "$DIR/bin/host-python"
: > "$DIR/host-libs.txt"
for soname in "${!HOST[@]}"; do
  read -r size path <<<"${HOST[$soname]}"
  printf '%s\t%s\t%s\n' "$soname" "$size" "$path" >> "$DIR/host-libs.txt"
done
sort -o "$DIR/host-libs.txt" "$DIR/host-libs.txt"

cat > "$DIR/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs the GPU checks from this bundle: gpu-check.sh finds the libraries the
# bundle does not carry (host-libs.txt), sets the library path for the bundled
# binaries, and writes its logs to $OUT (else gpu-check-logs/ here).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec bash "$here/gpu-check.sh" --bundle "$here" "$@"
EOF
cat > "$DIR/env.sh" <<'EOF'
# source this file: the bundle's ddprun and train on PATH, its libraries (and
# the machine's NCCL and cuBLAS, found as gpu-check.sh finds them) on
# LD_LIBRARY_PATH, and DDP_PYTHON set so that Python workers run without them.
_ddp_bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
eval "$(bash "$_ddp_bundle/gpu-check.sh" --bundle "$_ddp_bundle" --print-env)"
unset _ddp_bundle
EOF
cat > "$DIR/unpack.sh" <<'EOF'
#!/usr/bin/env bash
# Unpacks the libraries stored gzipped to keep the bundle small (lib/NAME.gz ->
# lib/NAME). Run once before starting bin/ddprun by hand; run.sh and env.sh do it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
for gz in "$here"/lib/*.gz; do
  [ -e "$gz" ] || continue
  lib=${gz%.gz}
  [ -e "$lib" ] && [ "$lib" -nt "$gz" ] && continue
  if ! gzip -dc "$gz" > "$lib.unpacking.$$" 2>/dev/null; then
    rm -f "$lib.unpacking.$$"
    echo "unpack.sh: cannot unpack $gz into $lib (a read-only folder? copy the bundle somewhere writable)" >&2
    exit 1
  fi
  mv "$lib.unpacking.$$" "$lib"
done
EOF
chmod +x "$DIR/run.sh" "$DIR/unpack.sh"

# ------------------------------------------------------------------ check
# Every ELF file resolves in a clean environment with only the bundle's lib/
# on the library path: nothing "not found" except the host libraries, and
# nothing but glibc/driver/host libraries from outside the bundle.
problems=0
for f in "$DIR"/bin/* "$DIR"/lib/*; do
  [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
  while IFS= read -r line; do
    line=${line#"${line%%[![:space:]]*}"}
    case "$line" in
      *" => "*) soname=${line%% =>*}; path=${line#*=> }; path=${path%% (*} ;;
      *) continue ;;
    esac
    is_system "$soname" && continue
    [ -n "${HOST[$soname]:-}" ] && continue
    case "$path" in
      "$DIR"/lib/*) ;;
      "not found") echo "gpu-bundle: $(basename "$f"): $soname not found with LD_LIBRARY_PATH=$DIR/lib" >&2; problems=1 ;;
      *) echo "gpu-bundle: $(basename "$f"): $soname loads from outside the bundle: $path" >&2; problems=1 ;;
    esac
  done < <(env -i LD_LIBRARY_PATH="$DIR/lib" ldd "$f")
done
[ "$problems" = 0 ] || die "the bundle in $DIR is incomplete (see above)"

# The largest libraries travel gzipped (unpack.sh restores them).
for f in "$DIR"/lib/*; do
  [ "$(stat -c %s "$f")" -gt "$COMPRESS_MIN" ] || continue
  gzip -9 -n "$f"
  note "stored gzipped: lib/$(basename "$f").gz ($(stat -c %s "$f.gz") bytes)"
done
# Back to the packed state: the unpacked copies of lib/*.gz removed.
packed() {
  local gz
  for gz in "$DIR"/lib/*.gz; do
    [ -e "$gz" ] && rm -f "${gz%.gz}"
  done
  return 0
}

size=$(du -sb "$DIR" | cut -f1)
{
  echo "ddprun GPU bundle"
  echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $built_type build in $BUILD_DIR"
  echo "CUDA: $("$cuda_root/bin/nvcc" --version 2>/dev/null | grep -o 'release [0-9.]*' || echo '?') ($cuda_root)"
  echo "size: $size bytes (limit $LIMIT)"
  echo "stored gzipped (unpack.sh): $(cd "$DIR/lib" && ls -- *.gz 2>/dev/null | tr '\n' ' ')"
  echo "not carried (found on the GPU machine by gpu-check.sh):"
  sed 's/^/  /' "$DIR/host-libs.txt"
} > "$DIR/BUNDLE-INFO"
size=$(du -sb "$DIR" | cut -f1)
if [ "$size" -gt "$LIMIT" ]; then
  du -ab "$DIR" | sort -rn | head -12 >&2
  die "the bundle is $size bytes, over the ${LIMIT_MIB} MiB limit ($LIMIT bytes)"
fi
note "bundle $DIR: $size bytes ($(( size / 1024 / 1024 )) MiB of ${LIMIT_MIB}), $(ls "$DIR/bin" | wc -l) in bin/, $(ls "$DIR/lib" | wc -l) in lib/"
note "left to the GPU machine: $(cut -f1 "$DIR/host-libs.txt" | tr '\n' ' ')"

# ------------------------------------------------------------------ verify
if [ "$verify" = 1 ]; then
  run_clean() {  # the bundle alone: no PATH into the build, library path only into the bundle
    env -i LD_LIBRARY_PATH="$DIR/lib" PATH=/usr/bin:/bin HOME="${HOME:-/tmp}" TMPDIR="${TMPDIR:-/tmp}" \
      DDP_TEST_BIN_DIR="$DIR/bin" "$@"
  }
  log=$(mktemp -d "${TMPDIR:-/tmp}/gpu-bundle-verify.XXXXXX")
  "$DIR/unpack.sh"
  trap packed EXIT   # leave the bundle packed (under the limit) however this ends
  note "verify: ddprun --nproc_per_node=2 train --steps 20 (logs in $log)"
  run_clean "$DIR/bin/ddprun" --nproc_per_node=2 "$DIR/bin/train" --steps 20 > "$log/train.out" 2>&1 ||
    { tail -20 "$log/train.out" >&2; die "verify: ddprun + train from the bundle failed (log: $log/train.out)"; }
  grep -q 'summary: 20 steps' "$log/train.out" ||
    { tail -20 "$log/train.out" >&2; die "verify: train printed no summary of 20 steps"; }
  note "verify: $(grep -m1 -o 'summary: 20 steps.*' "$log/train.out")"
  for t in nccl_tests grad_sync_tests train_integration_tests; do
    note "verify: $t (CPU tests run, GPU tests skip without a GPU)"
    if ! run_clean timeout 1800 "$DIR/bin/$t" > "$log/$t.out" 2>&1; then
      grep -E '^\[  FAILED  \]' "$log/$t.out" >&2 || tail -30 "$log/$t.out" >&2
      die "verify: $t from the bundle failed (log: $log/$t.out)"
    fi
    note "verify: $t: $(grep -E '^\[  PASSED  \]' "$log/$t.out" | tail -1)$(grep -E '^\[  SKIPPED \] [0-9]' "$log/$t.out" | sed 's/^\[  SKIPPED \]/, skipped/; s/, listed below://' | tail -1)"
  done
  packed
  note "verify: passed (the bundle is packed again: $(du -sb "$DIR" | cut -f1) bytes)"
fi
