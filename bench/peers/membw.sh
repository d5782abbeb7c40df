#!/bin/bash
# Run: bash membw.sh  -- builds membw.c (gcc -O2 -march=native) and prints memcpy/sum bandwidths (payload GB/s = array bytes / time).
# note: gcc 12 -O3 produced a bogus 0.00 minimum (bw[0] lost after qsort) here; -O2 (which still vectorizes the sum loops) is correct.
set -e
cd "$(dirname "$0")"; source ./common.sh
gcc -O2 -march=native -pthread -o $S/membw membw.c
$S/membw
