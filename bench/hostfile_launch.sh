#!/usr/bin/env bash
# ddprun --hostfile over real ssh: 8 test hosts (network namespaces
# 198.18.0.2-9, each running Debian's sshd bound to its own address, keys made
# here) x 2 trivial workers, launched from a front end on a ninth namespace
# (198.18.0.1) that has nothing but ssh to them. Side by side in each round:
# the floor (8 parallel `ssh host true`), `ddprun --hostfile` and `mpirun
# --hostfile` (Debian's Open MPI, same hosts, same sshd, same workers), each
# with two workers: BUILD_DIR/bench/barrier_worker (compiled) and the same
# barrier in Python (/usr/bin/python3, whose start-up on 16 interpreters the
# floor does not pay). Needs root, openssh-server and openmpi-bin (install-deps).
# Usage: bench/hostfile_launch.sh BUILD_DIR [ROUNDS]
# Prints the median over ROUNDS of: launch to all 16 workers running, to the
# first barrier passed by all 16 (a TCP barrier on MASTER_ADDR:MASTER_PORT),
# and to the launcher's exit; then the ratios to the floor and to mpirun.
set -euo pipefail
BUILD_DIR=$(cd "${1:-build}" && pwd)
ROUNDS=${2:-7}
DDPRUN="$BUILD_DIR/launcher/ddprun"
BARRIER_BIN="$BUILD_DIR/bench/barrier_worker"
SYSPY=/usr/bin/python3
HOSTS=8
[[ $(id -u) == 0 ]] || { echo "hostfile_launch: needs root for network namespaces and sshd" >&2; exit 1; }
for f in "$DDPRUN" "$BARRIER_BIN"; do
  [[ -x $f ]] || { echo "hostfile_launch: $f missing: build first" >&2; exit 1; }
done
[[ -x /usr/sbin/sshd ]] || { echo "hostfile_launch: no /usr/sbin/sshd (openssh-server)" >&2; exit 1; }
have_mpirun=0
command -v mpirun >/dev/null && have_mpirun=1
OUT=$(mktemp -d)
chmod 700 "$OUT"
P=ddpbh$$
NAMESPACES=($P-sw)
for i in $(seq 0 $HOSTS); do NAMESPACES+=($P-h$i); done
SSHD_PIDS=()
cleanup() {
  for pid in "${SSHD_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  # What is left in this script's own namespaces (sessions, workers) was started here.
  for ns in "${NAMESPACES[@]}"; do ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true; done
  for ns in "${NAMESPACES[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  rm -rf "$OUT"
}
trap cleanup EXIT

ip netns add $P-sw
ip -n $P-sw link add br0 type bridge
ip -n $P-sw link set br0 up
for i in $(seq 0 $HOSTS); do
  ip netns add $P-h$i
  ip -n $P-sw link add p$i type veth peer name eth0 netns $P-h$i
  ip -n $P-sw link set p$i master br0 up
  ip -n $P-h$i addr add 198.18.0.$((i + 1))/24 dev eth0
  ip -n $P-h$i link set eth0 up
  ip -n $P-h$i link set lo up
done

# Keys, known_hosts and the client config; one sshd per host (h1..h8).
ssh-keygen -q -t ed25519 -N '' -f "$OUT/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$OUT/id"
cp "$OUT/id.pub" "$OUT/authorized_keys"
key=$(cut -d' ' -f1-2 "$OUT/host_key.pub")
: >"$OUT/known_hosts"
: >"$OUT/hosts"
for i in $(seq 1 $HOSTS); do
  echo "198.18.0.$((i + 1)) $key" >>"$OUT/known_hosts"
  echo "198.18.0.$((i + 1)) slots=2" >>"$OUT/hosts"
done
cat >"$OUT/ssh_config" <<CFG
Host *
  User root
  IdentityFile $OUT/id
  IdentitiesOnly yes
  UserKnownHostsFile $OUT/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  LogLevel ERROR
CFG
mkdir -p /run/sshd
for i in $(seq 1 $HOSTS); do
  cat >"$OUT/sshd_$i" <<CFG
ListenAddress 198.18.0.$((i + 1))
HostKey $OUT/host_key
PidFile none
AuthorizedKeysFile $OUT/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
UseDNS no
LogLevel ERROR
CFG
  ip netns exec $P-h$i /usr/sbin/sshd -D -e -f "$OUT/sshd_$i" 2>>"$OUT/sshd.log" &
  SSHD_PIDS+=($!)
done
FRONT=(ip netns exec $P-h0)
for i in $(seq 1 $HOSTS); do
  for try in $(seq 100); do
    "${FRONT[@]}" ssh -F "$OUT/ssh_config" -o BatchMode=yes 198.18.0.$((i + 1)) true 2>/dev/null && break
    [[ $try == 100 ]] && { echo "hostfile_launch: sshd on host $i did not come up" >&2; cat "$OUT/sshd.log" >&2; exit 1; }
    sleep 0.1
  done
done

cat >"$OUT/barrier.py" <<'PY'
# Prints when it runs, then passes a TCP barrier on MASTER_ADDR:MASTER_PORT.
import os, socket, time
print("START %.6f" % time.time(), flush=True)
env = os.environ
rank = int(env.get("RANK", env.get("OMPI_COMM_WORLD_RANK", "0")))
world = int(env.get("WORLD_SIZE", env.get("OMPI_COMM_WORLD_SIZE", "1")))
addr, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
if rank == 0:
    srv = socket.create_server(("", port), reuse_port=False)
    peers = [srv.accept()[0] for _ in range(world - 1)]
    for p in peers: p.sendall(b"x")
else:
    for attempt in range(4000):
        try:
            s = socket.create_connection((addr, port)); break
        except OSError:
            if attempt == 3999: raise
            time.sleep(0.005)
    s.recv(1)
print("BARRIER %.6f" % time.time(), flush=True)
PY

WORKERS=$((2 * HOSTS))
# One launch; prints "running barrier exit" seconds after it began.
# KIND: floor, ddprun-bin, ddprun-py, mpirun-bin or mpirun-py.
run_job() {
  local kind=$1 port=$2 t0 t1
  local log=$OUT/$kind.out
  local worker=("$SYSPY" "$OUT/barrier.py")
  [[ $kind == *-bin ]] && worker=("$BARRIER_BIN")
  t0=$(date +%s.%N)
  case $kind in
    floor)
      local pids=()
      for i in $(seq 1 $HOSTS); do
        "${FRONT[@]}" ssh -F "$OUT/ssh_config" -o BatchMode=yes 198.18.0.$((i + 1)) true &
        pids+=($!)
      done
      wait "${pids[@]}"  # not the sshds
      t1=$(date +%s.%N)
      $SYSPY -c "import sys; t=float(sys.argv[2])-float(sys.argv[1]); print('%.4f %.4f %.4f' % (t, t, t))" "$t0" "$t1"
      return ;;
    ddprun-*)
      (cd "$OUT" && timeout -s KILL 60 "${FRONT[@]}" "$DDPRUN" --hostfile "$OUT/hosts" \
        --ssh_opts "-F $OUT/ssh_config" --no_prefix --no_python "${worker[@]}") >"$log" 2>&1 || true ;;
    mpirun-*)
      (cd "$OUT" && timeout -s KILL 60 "${FRONT[@]}" mpirun --allow-run-as-root --hostfile "$OUT/hosts" \
        -np $WORKERS --mca plm_rsh_agent ssh --mca plm_rsh_args "-F $OUT/ssh_config" \
        --mca plm_rsh_no_tree_spawn 1 --mca oob_tcp_if_include eth0 --mca btl self,tcp \
        --mca btl_tcp_if_include eth0 -x MASTER_ADDR=198.18.0.2 -x MASTER_PORT=$port \
        "${worker[@]}") >"$log" 2>&1 || true ;;
  esac
  t1=$(date +%s.%N)
  $SYSPY - "$t0" "$t1" "$log" $WORKERS <<'PY'
import re, sys
t0, t1, n = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[4])
text = open(sys.argv[3]).read()
starts = [float(x) for x in re.findall(r"START (\d+\.\d+)", text)]
barriers = [float(x) for x in re.findall(r"BARRIER (\d+\.\d+)", text)]
if len(starts) != n or len(barriers) != n:
    # A failed launch is counted, not timed; its output goes to stderr.
    sys.stderr.write("%s: expected %d workers, got %d starts and %d barriers:\n%s\n" % (sys.argv[3], n, len(starts), len(barriers), text[-2000:]))
    print("fail")
    sys.exit(0)
print("%.4f %.4f %.4f" % (max(starts) - t0, max(barriers) - t0, t1 - t0))
PY
}

kinds=(floor ddprun-bin ddprun-py)
[[ $have_mpirun == 1 ]] && kinds+=(mpirun-bin mpirun-py)
for k in "${kinds[@]}"; do : >"$OUT/$k.txt"; done
for r in $(seq "$ROUNDS"); do
  # Each round in another order, so no launcher always goes first.
  for j in $(seq 0 $((${#kinds[@]} - 1))); do
    k=${kinds[$(((j + r) % ${#kinds[@]}))]}
    run_job "$k" $((29500 + r)) >>"$OUT/$k.txt"
  done
done
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs"
echo "$HOSTS hosts x 2 trivial workers over ssh (bin: compiled; py: Python), median of $ROUNDS rounds, seconds from launch:"
$SYSPY - "$OUT" "${kinds[@]}" <<'PY'
import statistics as st, sys
out, kinds = sys.argv[1], sys.argv[2:]
med, failed = {}, {}
for k in kinds:
    lines = [l for l in open("%s/%s.txt" % (out, k)) if l.strip()]
    rows = [list(map(float, l.split())) for l in lines if l.strip() != "fail"]
    failed[k] = len(lines) - len(rows)
    med[k] = [st.median(c) for c in zip(*rows)]
print("%-32s %12s %12s %12s" % ("launcher", "all_running", "1st_barrier", "exit"))
def name(k):
    if k == "floor":
        return "8 x ssh host true (floor)"
    launcher, worker = k.split("-")
    return "%s --hostfile, %s worker" % (launcher, {"bin": "compiled", "py": "Python"}[worker])
for k in kinds:
    print("%-32s %12.3f %12.3f %12.3f%s" % (name(k), *med[k], "   (%d failed launches)" % failed[k] if failed[k] else ""))
f = med["floor"][0]
for w in ("bin", "py"):
    d = med["ddprun-" + w]
    print("%-32s %11.2fx %11.2fx %11.2fx" % ("ddprun / floor, " + w, d[0] / f, d[1] / f, d[2] / f))
    if "mpirun-" + w in med:
        m = med["mpirun-" + w]
        print("%-32s %11.2fx %11.2fx %11.2fx" % ("mpirun / ddprun, " + w, m[0] / d[0], m[1] / d[1], m[2] / d[2]))
PY
