#!/usr/bin/env bash
# Every C, C++ and CUDA source of the project is as clang-format (the
# .clang-format at the root) writes it. Fix with:
#   git ls-files '*.cc' '*.h' '*.c' '*.cu' | xargs clang-format -i
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "skipped: clang-format is not installed (scripts/install-deps.sh installs it)"
  exit 0
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cc' '*.h' '*.c' '*.cu')
else
  mapfile -t files < <(find common launcher worker tests bench fuzz proto -name '*.cc' -o -name '*.h' -o -name '*.c' -o -name '*.cu')
fi
present=()
for f in "${files[@]}"; do
  if [[ -e $f ]]; then present+=("$f"); fi
done
# One clang-format for all (one per file took seven times as long); it names
# each file that differs in its diagnostics ("FILE:LINE:COL: error: ...").
if ! report=$(clang-format --dry-run --Werror "${present[@]}" 2>&1); then
  mapfile -t bad < <(sed -n 's/^\(.*\):[0-9]*:[0-9]*: error: .*/\1/p' <<<"$report" | sort -u)
  if ((${#bad[@]})); then
    printf 'not clang-formatted: %s\n' "${bad[@]}"
  else
    printf 'clang-format failed:\n%s\n' "$report"
  fi
  exit 1
fi
echo "clang-format: ${#files[@]} files as formatted"
