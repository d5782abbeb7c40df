#!/usr/bin/env bash
# The installed copy on its own: `cmake --install` of BUILD_DIR into a fresh
# prefix, then the smallest libddp program (examples/hello_worker.cc)
# built out of tree against it twice, with find_package(ddp) and with
# pkg-config, each run on 2 ranks by the installed ddprun (which must find its
# gRPC half in libexec/). Usage: tests/install_test.sh BUILD_DIR
set -euo pipefail
BUILD_DIR=$(cd "$1" && pwd)
SRC=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
cmake --install "$BUILD_DIR" --prefix "$prefix" >/dev/null
for f in bin/ddprun libexec/ddprun/libddprun_rpc.so include/ddp/ddp.h include/ddp/common/error.h; do
  [[ -e $prefix/$f ]] || { echo "not installed: $f"; exit 1; }
done

mkdir -p "$tmp/app"
cp "$SRC/examples/hello_worker.cc" "$tmp/app/main.cc"
cat >"$tmp/app/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(uses_ddp CXX)
find_package(ddp 0.1 REQUIRED)
add_executable(hello main.cc)
target_link_libraries(hello PRIVATE ddp::ddp)
CMAKE
cmake -S "$tmp/app" -B "$tmp/app/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/app/build" >/dev/null

libdir=$(cd "$prefix" && ls -d lib*/libddp.so | head -1 | xargs dirname)
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
# shellcheck disable=SC2046
g++ -std=c++20 "$tmp/app/main.cc" -o "$tmp/app/hello_pc" $(pkg-config --cflags --libs ddp)

export LD_LIBRARY_PATH=$prefix/$libdir  # a prefix outside the loader's paths

for program in "$tmp/app/build/hello" "$tmp/app/hello_pc"; do
  out=$(env -u DDPRUN_RPC_PLUGIN "$prefix/bin/ddprun" --nproc_per_node=2 "$program" 2>&1)
  for rank in 0 1; do
    grep -q "^\[rank $rank\] rank $rank passed the barrier; the ranks sum to 1$" <<<"$out" || {
      echo "$program under the installed ddprun:"; echo "$out"; exit 1; }
  done
  grep -q "libddprun_rpc.so" <<<"$out" && { echo "$out"; exit 1; }
  echo "ok: $(basename "$program") built against the installed libddp, run by the installed ddprun"
done
