#!/usr/bin/env bash
# Checks that each launcher room includes only the rooms it may use (see
# launcher/CMakeLists.txt): a file's folder says what it may include.
set -euo pipefail
cd "$(dirname "$0")/../launcher"
declare -A allowed=(
  [cli]="cli"
  [worker_group]="worker_group"
  [rendezvous]="rendezvous"
  [store]="store rendezvous"
  [observe]="observe cli worker_group"
  [agent]="agent observe cli worker_group"
  [rpc]="rpc agent observe cli worker_group rendezvous store"
  [frontend]="frontend agent cli worker_group"
  [.]="agent cli worker_group frontend"
)
bad=0
for room in "${!allowed[@]}"; do
  if [[ $room == . ]]; then files=(*.cc); else files=("$room"/*.h "$room"/*.cc); fi
  for f in "${files[@]}"; do
    [[ -e $f ]] || continue
    while IFS= read -r used; do
      if [[ " ${allowed[$room]} " != *" $used "* ]]; then
        echo "launcher/$f includes $used/, which room '$room' may not use"
        bad=1
      fi
    done < <(grep -o '#include "[a-z_]*/' "$f" | sed 's/#include "//; s|/$||' | grep -E '^(cli|worker_group|rendezvous|store|observe|agent|rpc|frontend)$' | sort -u || true)
    if [[ $room != rpc ]] && grep -q '#include <grpc\|#include "grpc/\|\.grpc\.pb\.h"' "$f"; then
      echo "launcher/$f includes gRPC, which only rpc/ may"
      bad=1
    fi
  done
done
if ((bad)); then exit 1; fi
echo "launcher includes: every room uses only what it may"
