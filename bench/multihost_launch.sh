#!/usr/bin/env bash
# Multi-host launch: 2 test hosts (network namespaces, 198.18.0.1-2) x 4 workers,
# ddprun beside torchrun, the same trivial Python worker, in two forms:
#   c10d    --rdzv_backend=c10d --rdzv_endpoint=HOST0:PORT (the rendezvous
#           assigns node ranks)
#   static  --node_rank=K --master_addr=HOST0 --master_port=PORT (torchrun's
#           default backend: node rank 0 hosts)
# taking turns in each repetition (ddprun, torchrun, form by form). Needs root
# (CI and the test machine are).
# Usage: [FORMS="c10d static"] bench/multihost_launch.sh BUILD_DIR [RUNS]
# Prints, per form, the median over RUNS of: launch to all 8 workers running,
# launch to the first barrier passed by all 8 (a TCP barrier on MASTER_ADDR, at
# a port this script reserves: torchrun 2.x's agent store holds MASTER_PORT),
# and launch to both launchers' exit; then torchrun / ddprun for each. The peer
# is torchrun 2.x from scripts/install-torch-env.sh's environment (its workers
# under the same /usr/bin/python3 as ddprun's, PYTHON_EXEC), else Debian's
# torchrun 1.13.
set -euo pipefail
BUILD_DIR=$(cd "${1:-build}" && pwd)
RUNS=${2:-5}
FORMS=${FORMS:-c10d static}
DDPRUN="$BUILD_DIR/launcher/ddprun"
SYSPY=/usr/bin/python3
TORCHRUN2=${DDP_TORCH_ENV:-/opt/ddprun-torch}/bin/torchrun
[[ $(id -u) == 0 ]] || { echo "multihost_launch: needs root for network namespaces" >&2; exit 1; }
[[ -x $DDPRUN ]] || { echo "multihost_launch: $DDPRUN missing: build first" >&2; exit 1; }
OUT=$(mktemp -d)
P=ddpb$$
cleanup() {
  local pids
  pids=$(jobs -p)
  [[ -z $pids ]] || kill -KILL $pids 2>/dev/null || true
  for ns in $P-h0 $P-h1; do ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true; done
  for ns in $P-h0 $P-h1 $P-sw; do ip netns del "$ns" 2>/dev/null || true; rm -rf "/etc/netns/$ns"; done
  rm -rf "$OUT"
}
trap cleanup EXIT
ip netns add $P-sw
ip -n $P-sw link add br0 type bridge
ip -n $P-sw link set br0 up
for i in 0 1; do
  ip netns add $P-h$i
  ip -n $P-sw link add p$i type veth peer name eth0 netns $P-h$i
  ip -n $P-sw link set p$i master br0 up
  ip -n $P-h$i addr add 198.18.0.$((i + 1))/24 dev eth0
  ip -n $P-h$i link set eth0 up
  ip -n $P-h$i link set lo up
  # Each host has its own name, known to both (ip netns exec mounts this over
  # /etc/hosts): torchrun finds the c10d host and MASTER_ADDR by hostname.
  mkdir -p /etc/netns/$P-h$i
  printf '127.0.0.1 localhost\n198.18.0.1 %s-h0\n198.18.0.2 %s-h1\n' $P $P >/etc/netns/$P-h$i/hosts
done

cat > "$OUT/barrier.py" <<'PY'
# Prints when it runs, then passes a TCP barrier on MASTER_ADDR:BENCH_BARRIER_PORT.
import os, socket, sys, time
print("START %.6f" % time.time(), flush=True)
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["BENCH_BARRIER_PORT"])
if rank == 0:
    srv = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, reuse_port=False)
    peers = [srv.accept()[0] for _ in range(world - 1)]
    for p in peers: p.sendall(b"x")
else:
    for attempt in range(2000):
        try:
            s = socket.create_connection((addr, port)); break
        except OSError:
            if attempt == 1999: raise
            time.sleep(0.005)
    s.recv(1)
print("BARRIER %.6f" % time.time(), flush=True)
PY

# One job on both hosts; prints "running barrier exit" seconds after launch.
# PORT is the c10d endpoint's port, or the static form's MASTER_PORT.
run_job() {
  local kind=$1 form=$2 port=$3 id=$4 barrier_port=$5
  local t0 out0=$OUT/$kind.0 out1=$OUT/$kind.1
  t0=$(date +%s.%N)
  for i in 0 1; do
    # The form's options, in ddprun's and torchrun 1.13's spelling and in torchrun 2.x's.
    local cmd join join2
    if [[ $form == c10d ]]; then
      join=(--rdzv_backend=c10d --rdzv_endpoint=$P-h0:$port --rdzv_id="$id")
      join2=(--rdzv-backend=c10d --rdzv-endpoint=$P-h0:$port --rdzv-id="$id")
    else
      join=(--node_rank=$i --master_addr=$P-h0 --master_port=$port)
      join2=(--node-rank=$i --master-addr=$P-h0 --master-port=$port)
    fi
    if [[ $kind == ddprun ]]; then
      cmd=("$DDPRUN" --nnodes=2 "${join[@]}" --nproc_per_node=4 --no_prefix "$SYSPY" "$OUT/barrier.py")
    elif [[ -x $TORCHRUN2 ]]; then
      cmd=(env PYTHON_EXEC=$SYSPY "$TORCHRUN2" --nnodes=2 "${join2[@]}" --nproc-per-node=4
           --monitor-interval 0.1 "$OUT/barrier.py")
    else
      cmd=(/usr/bin/torchrun --nnodes=2 "${join[@]}" --nproc_per_node=4
           --redirects 9:1 --tee 9:1 --monitor_interval 0.1 "$OUT/barrier.py")
    fi
    cmd=(env BENCH_BARRIER_PORT="$barrier_port" "${cmd[@]}")
    # A host of its own: network namespace and hostname.
    ip netns exec $P-h$i unshare --uts sh -c 'hostname "$0"; exec timeout -s KILL 120 "$@"' \
      $P-h$i "${cmd[@]}" >"$OUT/$kind.$i" 2>&1 &
  done
  wait
  local t1
  t1=$(date +%s.%N)
  $SYSPY - "$t0" "$t1" "$out0" "$out1" <<'PY'
import re, sys
t0, t1 = float(sys.argv[1]), float(sys.argv[2])
text = open(sys.argv[3]).read() + open(sys.argv[4]).read()
starts = [float(x) for x in re.findall(r"START (\d+\.\d+)", text)]
barriers = [float(x) for x in re.findall(r"BARRIER (\d+\.\d+)", text)]
if len(starts) != 8 or len(barriers) != 8:
    sys.exit("expected 8 workers, got %d starts and %d barriers:\n%s" % (len(starts), len(barriers), "\n".join(l for l in text.splitlines() if "Error" in l or "error" in l)[-3000:]))
print("%.4f %.4f %.4f" % (max(starts) - t0, max(barriers) - t0, t1 - t0))
PY
}

have_torchrun=0
TORCHRUN_NAME="torchrun 1.13"
[[ -x /usr/bin/torchrun ]] && have_torchrun=1
[[ -x $TORCHRUN2 ]] && have_torchrun=1 TORCHRUN_NAME="torchrun 2.x"
for form in $FORMS; do
  [[ $form == c10d || $form == static ]] || { echo "multihost_launch: FORMS: $form is neither c10d nor static" >&2; exit 64; }
  : >"$OUT/ddprun-$form.txt"
  : >"$OUT/torchrun-$form.txt"
done
# Every job has ports of its own (a rendezvous or MASTER_PORT, and a barrier).
job=0
for r in $(seq "$RUNS"); do
  for form in $FORMS; do
    for kind in ddprun torchrun; do
      [[ $kind == ddprun || $have_torchrun == 1 ]] || continue
      job=$((job + 1))
      run_job $kind $form $((30000 + job)) "$kind$r" $((31000 + job)) >>"$OUT/$kind-$form.txt"
    done
  done
done
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
for form in $FORMS; do
  echo
  echo "$form form: 2 hosts x 4 workers (trivial Python barrier), median of $RUNS runs, seconds from launch:"
  $SYSPY - "$OUT/ddprun-$form.txt" "$OUT/torchrun-$form.txt" "$TORCHRUN_NAME" <<'PY'
import statistics as st, sys
def med(path):
    rows = [list(map(float, l.split())) for l in open(path) if l.strip()]
    return [st.median(c) for c in zip(*rows)] if rows else None
d, t = med(sys.argv[1]), med(sys.argv[2])
print("%-10s %12s %12s %12s" % ("launcher", "all_running", "1st_barrier", "exit"))
print("%-10s %12.3f %12.3f %12.3f" % ("ddprun", *d))
if t:
    print("%-10s %12.3f %12.3f %12.3f   (%s)" % ("torchrun", *t, sys.argv[3]))
    print("%-10s %11.1fx %11.1fx %11.1fx" % ("ratio", t[0] / d[0], t[1] / d[1], t[2] / d[2]))
else:
    print("torchrun: not installed (scripts/install-torch-env.sh, or Debian's python3-torch)")
PY
done
