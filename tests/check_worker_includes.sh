#!/usr/bin/env bash
# Checks that each room of libddp's sources (worker/src) includes only the
# rooms it may use (see worker/CMakeLists.txt): a file's folder says what it
# may touch. Public headers (ddp/...) are open to every room.
set -euo pipefail
cd "$(dirname "$0")/../worker/src"
declare -A allowed=(
  [core]="core"
  [heal]="heal core"
  [kernels]="kernels"
  [device]="device"
  [backends/local]="backends/local core"
  [backends/gloo]="backends/gloo core kernels"
  [backends/nccl]="backends/nccl core device"
  [backends/shm]="backends/shm core kernels"
  [grad]="grad core kernels device helpers backends/shm"
  [helpers]="helpers core"
  [c_api]="c_api"
)
room_of() {  # the room of an included path: its first folder, or first two under backends/
  case $1 in
    backends/*) echo "$1" | cut -d/ -f1-2 ;;
    */*) echo "${1%%/*}" ;;
    *) echo "(none)" ;;
  esac
}
bad=0
while IFS= read -r f; do
  dir=$(dirname "$f")
  room=$(room_of "$f")
  if [[ -z ${allowed[$room]+x} ]]; then
    echo "worker/src/$f is in no room (add its folder to tests/check_worker_includes.sh)"
    bad=1
    continue
  fi
  while IFS= read -r path; do
    [[ $path == ddp/* ]] && continue
    used=$(room_of "$path")
    if [[ " ${allowed[$room]} " != *" $used "* ]]; then
      echo "worker/src/$f includes $path, which room '$room' may not use"
      bad=1
    fi
  done < <(grep -o '#include "[^"]*"' "$f" | sed 's/#include "//; s/"$//' || true)
  unset dir
done < <(find . -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' \) | sed 's|^\./||' | sort)
if ((bad)); then exit 1; fi
echo "worker includes: every room uses only what it may"
