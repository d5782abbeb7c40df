#!/usr/bin/env bash
# Stragglers named live (docs/observability.md#stragglers), on this machine:
#   clean:  the reference trainer on 2 ranks, nothing slowed, for SECONDS;
#           every straggler event is a false alarm. Prints the events and the
#           highest WAITED-FOR score seen (status polled every 2 s).
#   pulse:  the same with rank 1 stopped STOP_MS out of every PERIOD_MS
#           (SIGSTOP/SIGCONT) from the 10th second; prints how long after the
#           first pulse rank 1 was named (or that it was not, within SECONDS).
# NODES=2: the same 2 ranks as two nodes of one rank each on loopback (c10d
#           rendezvous on node 0): judged across nodes at the rendezvous.
# Usage: [NODES=1|2] bench/straggler_watch.sh BUILD_DIR clean|pulse [SECONDS] [STOP_MS] [PERIOD_MS]
# e.g.   bench/straggler_watch.sh build clean 600
#        bench/straggler_watch.sh build pulse 90 60 300
#        NODES=2 bench/straggler_watch.sh build clean 600
set -euo pipefail
BUILD=$1
MODE=$2
SECONDS_RUN=${3:-600}
STOP_MS=${4:-60}
PERIOD_MS=${5:-300}
[[ $MODE == clean || $MODE == pulse ]] || { echo "mode: clean or pulse" >&2; exit 2; }
NODES=${NODES:-1}
[[ $NODES == 1 || $NODES == 2 ]] || { echo "NODES: 1 or 2" >&2; exit 2; }
OUT=$(mktemp -d)
JOBS=()
cleanup() {
  for job in "${JOBS[@]}"; do
    kill "$job" 2>/dev/null || true
    wait "$job" 2>/dev/null || true
  done
  rm -rf "$OUT"
}
trap cleanup EXIT
export XDG_RUNTIME_DIR=$OUT
TRAIN=("$BUILD/examples/train" --epochs 1000000 --log_every 1000000)
if [[ $NODES == 1 ]]; then
  "$BUILD/launcher/ddprun" --nproc_per_node=2 --run_id=straggler-watch \
    --events_file="$OUT/events.jsonl" "${TRAIN[@]}" >"$OUT/out" 2>"$OUT/err" &
  JOBS+=($!)
  status() { "$BUILD/launcher/ddprun" status --json 2>/dev/null || true; }
else
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  export DDP_RDZV_TOKEN=straggler-watch
  for node in 0 1; do  # node 0 hosts the rendezvous: it names a slow node
    "$BUILD/launcher/ddprun" --nnodes=2 --nproc_per_node=1 --node_rank=$node \
      --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:$port --run_id=straggler-watch \
      --events_file="$OUT/events$node.jsonl" "${TRAIN[@]}" >"$OUT/out$node" 2>"$OUT/err$node" &
    JOBS+=($!)
  done
  status() { "$BUILD/launcher/ddprun" status "127.0.0.1:$port" --json 2>/dev/null || true; }
fi
pid1=
for ((i = 0; i < 100; ++i)); do
  [[ -n $pid1 ]] && break
  sleep 0.3
  pid1=$(status | python3 -c '
import json, sys
for line in sys.stdin:
    for n in json.loads(line)["nodes"]:
        for r in n["ranks"]:
            if r["rank"] == 1 and r["libddp"]: print(r["pid"])' || true)
done
[[ -n $pid1 ]] || { echo "rank 1 never showed on the board" >&2; cat "$OUT"/err* >&2; exit 1; }
start=$(date +%s)
max=0
PULSER=
pulse_ns=0
stop_all() {
  if [[ -n $PULSER ]]; then
    kill "$PULSER" 2>/dev/null || true
    kill -CONT "$pid1" 2>/dev/null || true
  fi
  cleanup
}
trap stop_all EXIT
while (($(date +%s) - start < SECONDS_RUN)); do
  if [[ $MODE == pulse && -z $PULSER ]] && (($(date +%s) - start >= 10)); then
    pulse_ns=$(date +%s%N)
    python3 -c "
import os, signal, time
while True:
    os.kill($pid1, signal.SIGSTOP); time.sleep($STOP_MS / 1000)
    os.kill($pid1, signal.SIGCONT); time.sleep(($PERIOD_MS - $STOP_MS) / 1000)" 2>/dev/null &
    PULSER=$!
  fi
  if [[ -n $PULSER ]] && grep -qE 'straggler: (rank|node) 1 ' "$OUT/err"*; then
    printf 'rank 1 (stopped %s of every %s ms) named %.1f s after the first pulse\n' \
      "$STOP_MS" "$PERIOD_MS" "$(((($(date +%s%N) - pulse_ns) / 100000000)))e-1"
    grep -h 'straggler' "$OUT/err"*
    exit 0
  fi
  score=$(status | python3 -c '
import json, sys
nodes = [n for line in sys.stdin for n in json.loads(line)["nodes"]]
print(max([r["straggler_score"] for n in nodes for r in n["ranks"]] + [n.get("straggler_score", 0) for n in nodes] + [0]))' || echo 0)
  max=$(python3 -c "print(max($max, $score))")
  sleep 2
done
if [[ $MODE == pulse ]]; then
  echo "rank 1 was not named within $SECONDS_RUN s; highest score $max" >&2
  exit 1
fi
named=$(cat "$OUT"/events*.jsonl | grep -c '"name":"straggler"' || true)
printf 'clean run of %s s: %s straggler event(s), highest score %.3f\n' "$SECONDS_RUN" "$named" "$max"
cat "$OUT"/events*.jsonl | grep '"name":"straggler"' || true
