#!/usr/bin/env bash
# Checks that each room of libddp's sources (worker/src) includes only the
# rooms it may use (see worker/CMakeLists.txt): a file's folder says what it
# may touch; a public header (ddp/X.h) counts as the room that implements it.
set -euo pipefail
cd "$(dirname "$0")/../worker/src"
# base/ is the floor: every room may use it, and it uses nothing of libddp.
declare -A allowed=(
  [base]="base"
  [core]="core base"
  [heal]="heal helpers core base"
  [kernels]="kernels base"
  [device]="device base"
  [backends/local]="backends/local core base"
  [backends/gloo]="backends/gloo core kernels base"
  [backends/nccl]="backends/nccl core device base"
  [backends/shm]="backends/shm core kernels base"
  [grad]="grad heal core kernels device helpers base"
  [helpers]="helpers core base"
  [c_api]="c_api core heal grad helpers base"
)
# The room that implements each public header: including ddp/X.h uses that
# room, so a public header cannot hide a back-edge (core calling helpers/).
declare -A implemented_in=(
  [ddp/types.h]=base [ddp/log.h]=base
  [ddp/ddp.h]=core [ddp/process_group.h]=core [ddp/store.h]=core [ddp/work.h]=core
  [ddp/params.h]=helpers
  [ddp/heal.h]=heal
  [ddp/grad_sync.h]=grad [ddp/grad_averager.h]=grad [ddp/shared_grad_sum.h]=grad
  [ddp/param_shards.h]=grad [ddp/bucket_layout.h]=grad
  [ddp/metrics.h]=helpers [ddp/sampler.h]=helpers
  [ddp/ddp_c.h]=c_api
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
    [[ $path == ddp/common/* ]] && continue  # the launcher's and libddp's shared floor
    if [[ $path == ddp/* ]]; then
      if [[ -z ${implemented_in[$path]+x} ]]; then
        echo "worker/src/$f includes $path, which no room implements (add it to tests/check_worker_includes.sh)"
        bad=1
        continue
      fi
      used=${implemented_in[$path]}
    else
      used=$(room_of "$path")
    fi
    if [[ " ${allowed[$room]} " != *" $used "* ]]; then
      echo "worker/src/$f includes $path, which room '$room' may not use"
      bad=1
    fi
  done < <(grep -o '#include "[^"]*"' "$f" | sed 's/#include "//; s/"$//' || true)
  unset dir
done < <(find . -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' \) | sed 's|^\./||' | sort)
if ((bad)); then exit 1; fi
echo "worker includes: every room uses only what it may"
