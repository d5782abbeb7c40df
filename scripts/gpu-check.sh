#!/usr/bin/env bash
# The GPU checks, run from a bundle (scripts/gpu-bundle.sh) on a machine with
# a GPU: `bash DIR/run.sh` (or scripts/gpu-check.sh --bundle DIR).
#
#   gpu-check.sh [--bundle DIR] [--full] [--print-env]
#
# Prints the GPU (nvidia-smi), then runs each check and prints one summary
# line per check:
#   PASS name
#   FAIL name: reason
#   SKIP name: reason
# plus `INFO name: ...` lines with the figures (losses, times, throughput).
# Full logs go to $OUT when set, else DIR/gpu-check-logs/; summary.txt there
# holds the summary lines.
#
# Checks: the bundle's libraries resolve; ddprun + train on the CPU; the GPU
# tests of nccl_tests, grad_sync_tests, train_integration_tests and
# heal_train_tests (live recovery on the GPU engine) (a GPU test
# that skips while enough GPUs are visible is a FAIL; those needing more GPUs
# than visible are SKIP); PyTorch DDP with NCCL under ddprun and under
# torchrun (final loss and launch-to-first-all-reduce time); the same with
# Gloo on the CPU; Lightning on 1 GPU and with 2 CPU ranks under both
# launchers; train on the GPU against the CPU loss curve and against PyTorch
# eager throughput; allreduce_bench with NCCL device buffers against torch's
# all_reduce on the same GPUs; nccl_abort_probe (how fast NCCL reports a dead
# peer, what ncclCommAbort costs, a new communicator after it); gradsync_bench
# --device (GradSync's device buckets against the same step without gradient
# sync).
# Without a GPU the GPU checks print `SKIP name: no GPU ...` and the script
# exits 0. --full also runs every test of the three test binaries.
#
# Exit: 0 no FAIL, 1 some FAIL, 2 bad usage or no bundle.
# Env: PYTHON (default python3: the interpreter with torch), OUT,
# TORCHRUN_ARGS (extra flags for torchrun), CHECK_TIMEOUT_S (per run, 600).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
BUNDLE=""
FULL=0
PRINT_ENV=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) [ $# -ge 2 ] || { echo "gpu-check: --bundle needs a folder" >&2; exit 2; }; BUNDLE=$2; shift ;;
    --full) FULL=1 ;;
    --print-env) PRINT_ENV=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "$BUNDLE" ]; then
  if [ -x "$here/bin/ddprun" ]; then BUNDLE=$here; else BUNDLE=$here/../build-gpu-bundle; fi
fi
if [ ! -x "$BUNDLE/bin/ddprun" ]; then
  echo "gpu-check: no bundle at $BUNDLE ($BUNDLE/bin/ddprun missing): build one with scripts/gpu-bundle.sh" >&2
  exit 2
fi
BUNDLE=$(cd "$BUNDLE" && pwd)
if [ -x "$BUNDLE/unpack.sh" ]; then
  "$BUNDLE/unpack.sh" >&2 || exit 2
fi
BIN=$BUNDLE/bin
PYTHON=${PYTHON:-python3}
HOST_LD=${LD_LIBRARY_PATH-}
TIMEOUT=${CHECK_TIMEOUT_S:-600}

# ------------------------------------------------------------------ libraries
# The libraries the bundle does not carry (host-libs.txt: NCCL, cuBLAS): the
# caller's LD_LIBRARY_PATH, the CUDA toolkit, the loader's cache, then
# PyTorch's nvidia-* packages.
python_lib_dirs() {
  "$PYTHON" - 2>/dev/null <<'EOF' || true
import importlib, os
for name in ("nvidia", "torch"):
    try:
        m = importlib.import_module(name)
    except Exception:
        continue
    for p in getattr(m, "__path__", []):
        print(p)
EOF
}
PY_DIRS=""
find_host_lib() {
  local soname=$1 d p
  local IFS=:
  for d in $HOST_LD /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -n "$d" ] && [ -e "$d/$soname" ] && { echo "$d"; return 0; }
  done
  unset IFS
  p=$(ldconfig -p 2>/dev/null | awk -v s="$soname" '$1 == s && /x86-64/ {print $NF; exit}')
  [ -n "$p" ] && { dirname "$p"; return 0; }
  [ -n "$PY_DIRS" ] || PY_DIRS=$(python_lib_dirs | tr '\n' ' ')
  for d in $PY_DIRS; do
    p=$(find "$d" -maxdepth 4 -name "$soname" -print -quit 2>/dev/null)
    [ -n "$p" ] && { dirname "$p"; return 0; }
  done
  return 1
}
BUNDLE_LD=$BUNDLE/lib
MISSING_LIBS=""
FOUND_LIBS=""
if [ -f "$BUNDLE/host-libs.txt" ]; then
  while IFS=$'\t' read -r soname _; do
    [ -n "$soname" ] || continue
    if d=$(find_host_lib "$soname"); then
      FOUND_LIBS+="$soname in $d ($(basename "$(readlink -f "$d/$soname")")); "
      case ":$BUNDLE_LD:" in *":$d:"*) ;; *) BUNDLE_LD+=":$d" ;; esac
    else
      MISSING_LIBS+="$soname "
    fi
  done < "$BUNDLE/host-libs.txt"
fi

# Then the caller's own path: the driver's libcuda may be found only through it.
[ -z "$HOST_LD" ] || BUNDLE_LD+=":$HOST_LD"

if [ "$PRINT_ENV" = 1 ]; then
  printf 'export DDP_HOST_LD_LIBRARY_PATH=%q\n' "$HOST_LD"
  printf 'export LD_LIBRARY_PATH=%q\n' "$BUNDLE_LD"
  printf 'export PATH=%q\n' "$BIN:$PATH"
  printf 'export DDP_PYTHON=%q\n' "$BIN/host-python"
  [ -z "$MISSING_LIBS" ] || printf 'echo %q >&2\n' "ddprun bundle: not found on this machine: $MISSING_LIBS"
  exit 0
fi

LOGS=${OUT:-$BUNDLE/gpu-check-logs}
mkdir -p "$LOGS"
SUMMARY=$LOGS/summary.txt
: > "$SUMMARY"
N_PASS=0 N_FAIL=0 N_SKIP=0
say() { echo "$*" | tee -a "$SUMMARY"; }
pass() { say "PASS $1"; N_PASS=$((N_PASS + 1)); }
fail() { say "FAIL $1: $2"; N_FAIL=$((N_FAIL + 1)); }
skip() { say "SKIP $1: $2"; N_SKIP=$((N_SKIP + 1)); }
info() { say "INFO $1: $2"; }
# One line of a log for a reason: its last line that says something.
last_words() { grep -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -1 | cut -c1-300; }

# The bundle's programs: its libraries first; Python workers started by
# ddprun go through host-python, which puts the caller's library path back.
brun() {
  env LD_LIBRARY_PATH="$BUNDLE_LD" DDP_HOST_LD_LIBRARY_PATH="$HOST_LD" DDP_PYTHON="$BIN/host-python" \
    PYTHON="$PYTHON" DDP_TEST_BIN_DIR="$BIN" timeout "$TIMEOUT" "$@"
}
# torchrun of the same interpreter, with the caller's environment. Without
# TORCHRUN_ARGS a failed start is tried once more with the flags Debian's
# torch 1.13 needs to start (--redirects 9:1 --tee 9:1); a torchrun that
# starts never sees them.
torchrun_cmd() {
  if [ -n "${TORCHRUN_ARGS+set}" ]; then
    timeout "$TIMEOUT" "$PYTHON" -m torch.distributed.run $TORCHRUN_ARGS "$@"
  elif ! timeout "$TIMEOUT" "$PYTHON" -m torch.distributed.run "$@"; then
    echo "gpu-check: torchrun failed; once more with --redirects 9:1 --tee 9:1"
    TORCHRUN_T0=$(now)   # the launch that counts
    timeout "$TIMEOUT" "$PYTHON" -m torch.distributed.run --redirects 9:1 --tee 9:1 "$@"
  fi
}
now() { date +%s.%N; }

echo "gpu-check: bundle $BUNDLE, logs in $LOGS"
[ -f "$BUNDLE/BUNDLE-INFO" ] && cp "$BUNDLE/BUNDLE-INFO" "$LOGS/BUNDLE-INFO.txt"
[ -z "$FOUND_LIBS" ] || info libraries "from this machine: $FOUND_LIBS"

# ------------------------------------------------------------------ the GPU
NGPU=0
NO_GPU=""
SMI=$(command -v nvidia-smi 2>/dev/null || true)
[ -n "$SMI" ] || [ ! -x /usr/local/nvidia/bin/nvidia-smi ] || SMI=/usr/local/nvidia/bin/nvidia-smi
if [ -z "$SMI" ]; then
  NO_GPU="no GPU: nvidia-smi not found"
elif ! "$SMI" -L > "$LOGS/nvidia-smi-L.txt" 2>&1; then
  NO_GPU="no GPU: nvidia-smi -L failed: $(last_words "$LOGS/nvidia-smi-L.txt")"
else
  NGPU=$(grep -c '^GPU [0-9]' "$LOGS/nvidia-smi-L.txt" || true)
  if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
    visible=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c '^[0-9A-Za-z]' || true)
    case "$CUDA_VISIBLE_DEVICES" in -1*) visible=0 ;; esac
    [ "$visible" -lt "$NGPU" ] && NGPU=$visible
  fi
  [ "$NGPU" -gt 0 ] || NO_GPU="no GPU: nvidia-smi -L lists none visible"
fi
if [ "$NGPU" -gt 0 ]; then
  "$SMI" > "$LOGS/nvidia-smi.txt" 2>&1 || true
  driver=$("$SMI" --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
  cuda=$(grep -o 'CUDA Version: [0-9.]*' "$LOGS/nvidia-smi.txt" | head -1 | cut -d' ' -f3)
  while IFS= read -r line; do echo "gpu-check: $line"; done < "$LOGS/nvidia-smi-L.txt"
  info gpu "$NGPU visible; driver ${driver:-?}, CUDA ${cuda:-?} (driver's); $(head -1 "$LOGS/nvidia-smi-L.txt")"
else
  echo "gpu-check: $NO_GPU"
fi
HAVE_TORCH=""
NO_TORCH="$PYTHON cannot import torch"
if "$PYTHON" -c 'import torch' > "$LOGS/python-torch.txt" 2>&1; then
  HAVE_TORCH=$("$PYTHON" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>>"$LOGS/python-torch.txt" || true)
  info python "$(command -v "$PYTHON" || echo "$PYTHON"): torch $HAVE_TORCH"
else
  NO_TORCH="$PYTHON cannot import torch: $(last_words "$LOGS/python-torch.txt")"
fi
TORCH_GPUS=0
[ -n "$HAVE_TORCH" ] && TORCH_GPUS=${HAVE_TORCH##* }
HAVE_TORCHRUN=0
[ -n "$HAVE_TORCH" ] && "$PYTHON" -c 'import torch.distributed.run' >/dev/null 2>&1 && HAVE_TORCHRUN=1

# ------------------------------------------------------------------ the bundle
bad=""
for f in "$BIN"/* "$BUNDLE"/lib/*; do
  [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
  nf=$(env LD_LIBRARY_PATH="$BUNDLE_LD" ldd "$f" 2>&1 | grep 'not found' | awk '{print $1}' | tr '\n' ' ' || true)
  [ -z "$nf" ] || bad+="$(basename "$f") needs $nf; "
done
if [ -n "$bad" ]; then
  fail bundle-libs "libraries not found: $bad(not carried and not found here: ${MISSING_LIBS:-none})"
else
  pass bundle-libs
fi

log=$LOGS/cpu-smoke.log
if brun env -u DDP_BACKEND "$BIN/ddprun" --nproc_per_node=2 "$BIN/train" --steps 20 > "$log" 2>&1 &&
   grep -q 'summary: 20 steps' "$log"; then
  pass cpu-smoke
  info cpu-smoke "$(grep -m1 -o 'summary: 20 steps.*' "$log")"
else
  fail cpu-smoke "ddprun --nproc_per_node=2 train --steps 20 failed: $(last_words "$log") (log: $log)"
fi

# ------------------------------------------------------------------ GPU tests
# binary: test=GPUs needed (the tests that skip without a GPU).
GPU_TESTS=(
  "nccl_tests Nccl.CommunicatorAndAllReduceOnAGpu=1 Nccl.EveryCollectiveDtypeAndOpInAWorldOfOneOnAGpu=1 Nccl.AWorldOfOneNamingNcclGetsANcclGroup=1 Nccl.CommunicatorsMadeOneAfterAnotherInOneProcessEachWork=1 Nccl.ACreationWhosePeerNeverComesEndsAfterTheConnectTimeout=1"
  "grad_sync_tests GradSyncDevice.CompressionIsRefusedForDeviceBuckets=1 GradSyncDevice.NcclAveragesDeviceBucketsInPlace=2"
  "train_integration_tests TrainGpu.OneGpuFollowsTheCpuLossCurve=1 TrainGpu.CheckpointsMoveBetweenCpuAndGpu=1 TrainGpu.LossDecreasesOnTwoGpus=2 TrainGpu.TwoGpusFollowTheOneGpuLossCurve=2"
  "heal_train_tests HealGpu.RanksKilledBetweenStepsAndMidStepAreReplacedOverNccl=1"
)
for entry in "${GPU_TESTS[@]}"; do
  read -r binary tests <<<"$entry"
  listed=1
  brun "$BIN/$binary" --gtest_list_tests > "$LOGS/$binary.list" 2>&1 || listed=0
  run=()
  for t in $tests; do
    name=${t%=*} need=${t#*=}
    suite=${name%%.*} test=${name#*.}
    if [ "$listed" = 0 ]; then
      fail "gtest/$name" "$binary does not start: $(last_words "$LOGS/$binary.list")"
    elif ! awk -v s="$suite." -v t="  $test" '$0 == s {in_s = 1; next} /^[^ ]/ {in_s = 0} in_s && $0 == t {found = 1} END {exit !found}' "$LOGS/$binary.list"; then
      fail "gtest/$name" "$binary has no test $name (renamed? update gpu-check.sh)"
    elif [ -n "$NO_GPU" ]; then
      skip "gtest/$name" "$NO_GPU"
    elif [ "$NGPU" -lt "$need" ]; then
      skip "gtest/$name" "needs $need GPUs, $NGPU visible"
    else
      run+=("$name")
    fi
  done
  [ ${#run[@]} -gt 0 ] || continue
  log=$LOGS/$binary.gpu.log
  filter=$(IFS=:; echo "${run[*]}")
  brun "$BIN/$binary" --gtest_filter="$filter" > "$log" 2>&1 || true
  for name in "${run[@]}"; do
    if grep -qF "[       OK ] $name " "$log"; then
      pass "gtest/$name"
    elif grep -qF "[  SKIPPED ] $name " "$log"; then
      why=$(grep -B3 -F "[  SKIPPED ] $name " "$log" | grep -v '^\[' | grep -v 'Skipped$' | tail -1)
      fail "gtest/$name" "skipped although $NGPU GPU(s) are visible: ${why:-see $log}"
    elif grep -qF "[  FAILED  ] $name " "$log"; then
      fail "gtest/$name" "failed: $(grep -m1 -A2 'Failure$' "$log" | tail -2 | tr '\n' ' ' | cut -c1-300) (log: $log)"
    else
      fail "gtest/$name" "did not finish: $(last_words "$log") (log: $log)"
    fi
  done
done
# ------------------------------------------------------------------ PyTorch DDP
# torch_check NAME BACKEND NPROC: the same script under ddprun and under torchrun.
torch_check() {
  local name=$1 backend=$2 n=$3 t0 verdict
  local dlog=$LOGS/$name.ddprun.log tlog=$LOGS/$name.torchrun.log
  t0=$(now)
  if ! brun "$BIN/ddprun" --nproc_per_node="$n" "$BUNDLE/py/torch_ddp_check.py" --backend "$backend" > "$dlog" 2>&1; then
    fail "$name" "under ddprun: $(last_words "$dlog") (log: $dlog)"
    return
  fi
  local args=("$n" "$dlog" "$t0")
  if [ "$HAVE_TORCHRUN" = 1 ]; then
    TORCHRUN_T0=$(now)
    if ! torchrun_cmd --nproc_per_node="$n" "$BUNDLE/py/torch_ddp_check.py" --backend "$backend" > "$tlog" 2>&1; then
      fail "$name" "under torchrun: $(last_words "$tlog") (log: $tlog)"
      return
    fi
    args+=("$tlog" "$TORCHRUN_T0")
  fi
  if verdict=$("$PYTHON" "$BUNDLE/py/check_reports.py" torch "${args[@]}"); then
    pass "$name"
    info "$name" "${verdict#OK }"
    [ "$HAVE_TORCHRUN" = 1 ] || info "$name" "no torchrun ($PYTHON -m torch.distributed.run): ddprun alone"
  else
    fail "$name" "${verdict#FAIL }"
  fi
}
if [ -z "$HAVE_TORCH" ]; then
  skip torch-ddp-nccl "$NO_TORCH"
  skip torch-ddp-gloo "$NO_TORCH"
else
  if [ -n "$NO_GPU" ]; then
    skip torch-ddp-nccl "$NO_GPU"
  elif [ "$TORCH_GPUS" -lt 1 ]; then
    fail torch-ddp-nccl "nvidia-smi shows $NGPU GPU(s) but torch ($HAVE_TORCH) sees none"
  else
    torch_check torch-ddp-nccl nccl 1
  fi
  torch_check torch-ddp-gloo gloo 2
fi

# ------------------------------------------------------------------ Lightning
# lightning_check NAME NPROC ARGS...: under ddprun and torchrun.
lightning_check() {
  local name=$1 n=$2 verdict rc
  shift 2
  local dlog=$LOGS/$name.ddprun.log tlog=$LOGS/$name.torchrun.log
  local args=("$n" "$dlog")
  rc=0
  brun "$BIN/ddprun" --nproc_per_node="$n" "$BUNDLE/py/lightning_check.py" "$@" > "$dlog" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then
    fail "$name" "under ddprun (exit $rc): $(last_words "$dlog") (log: $dlog)"
    return
  fi
  if [ "$HAVE_TORCHRUN" = 1 ]; then
    if ! torchrun_cmd --nproc_per_node="$n" "$BUNDLE/py/lightning_check.py" "$@" > "$tlog" 2>&1; then
      fail "$name" "under torchrun: $(last_words "$tlog") (log: $tlog)"
      return
    fi
    args+=("$tlog")
  fi
  if verdict=$("$PYTHON" "$BUNDLE/py/check_reports.py" lightning "${args[@]}"); then
    pass "$name"
    info "$name" "${verdict#OK }"
  else
    fail "$name" "${verdict#FAIL }"
  fi
}
NO_LIGHTNING=""
if [ -z "$HAVE_TORCH" ]; then
  NO_LIGHTNING=$NO_TORCH
elif ! "$PYTHON" -c 'import lightning' >/dev/null 2>&1 && ! "$PYTHON" -c 'import pytorch_lightning' >/dev/null 2>&1; then
  NO_LIGHTNING="neither lightning nor pytorch_lightning can be imported by $PYTHON"
fi
if [ -n "$NO_LIGHTNING" ]; then
  skip lightning-gpu "$NO_LIGHTNING"
  skip lightning-cpu-ddp "$NO_LIGHTNING"
else
  if [ -n "$NO_GPU" ]; then
    skip lightning-gpu "$NO_GPU"
  elif [ "$TORCH_GPUS" -lt 1 ]; then
    fail lightning-gpu "nvidia-smi shows $NGPU GPU(s) but torch ($HAVE_TORCH) sees none"
  else
    lightning_check lightning-gpu 1 --accelerator gpu --devices 1 --strategy ddp
  fi
  lightning_check lightning-cpu-ddp 2 --accelerator cpu --devices 2 --strategy ddp
fi

# ------------------------------------------------------------------ train on the GPU
TRAIN_CURVE=(--hidden 64 --layers 3 --steps 30 --log_every 1 --task classification
             --optimizer adam --lr 0.003 --batch_size 64)
TRAIN_BIG=(--hidden 1024 --layers 4 --batch_size 256 --steps 400 --log_every 400 --task classification)
if [ -n "$NO_GPU" ]; then
  skip train-cuda-curve "$NO_GPU"
  skip train-vs-eager "$NO_GPU"
else
  cpu_log=$LOGS/train-curve.cpu.log gpu_log=$LOGS/train-curve.gpu.log
  if ! brun env -u DDP_BACKEND OPENBLAS_NUM_THREADS=1 "$BIN/ddprun" --nproc_per_node=1 "$BIN/train" "${TRAIN_CURVE[@]}" --backend gloo > "$cpu_log" 2>&1; then
    fail train-cuda-curve "the CPU run failed: $(last_words "$cpu_log") (log: $cpu_log)"
  elif ! brun env -u DDP_BACKEND "$BIN/ddprun" --nproc_per_node=1 "$BIN/train" "${TRAIN_CURVE[@]}" --backend nccl > "$gpu_log" 2>&1; then
    fail train-cuda-curve "the GPU run failed: $(last_words "$gpu_log") (log: $gpu_log)"
  elif ! grep -q 'math on cuda:0' "$gpu_log"; then
    fail train-cuda-curve "train --backend nccl did not say 'math on cuda:0' (log: $gpu_log)"
  elif verdict=$("$PYTHON" "$BUNDLE/py/check_reports.py" curve "$cpu_log" "$gpu_log" 1e-3); then
    pass train-cuda-curve
    info train-cuda-curve "GPU vs CPU: ${verdict#OK }"
  else
    fail train-cuda-curve "GPU vs CPU: ${verdict#FAIL }"
  fi

  tlog=$LOGS/train-throughput.gpu.log elog=$LOGS/train-throughput.eager.log
  if ! brun env -u DDP_BACKEND "$BIN/ddprun" --nproc_per_node=1 "$BIN/train" "${TRAIN_BIG[@]}" --backend nccl > "$tlog" 2>&1; then
    fail train-vs-eager "train --backend nccl failed: $(last_words "$tlog") (log: $tlog)"
  elif [ "$TORCH_GPUS" -lt 1 ]; then
    skip train-vs-eager "no PyTorch with CUDA for the eager baseline (${HAVE_TORCH:-${NO_TORCH:-}})"
  elif ! timeout "$TIMEOUT" "$PYTHON" "$BUNDLE/py/eager_mlp_bench.py" --device cuda --hidden 1024 --layers 4 \
         --batch-size 256 --steps 400 > "$elog" 2>&1; then
    fail train-vs-eager "the eager baseline failed: $(last_words "$elog") (log: $elog)"
  elif verdict=$("$PYTHON" "$BUNDLE/py/check_reports.py" throughput "$tlog" "$elog"); then
    pass train-vs-eager
    info train-vs-eager "hidden 1024 x 4 layers, batch 256, 1 GPU: ${verdict#OK }"
  else
    fail train-vs-eager "${verdict#FAIL }"
  fi
  sync_line=$(grep -m1 -o 'summary: gradient sync.*' "$tlog" 2>/dev/null || true)
  [ -z "$sync_line" ] || info train-vs-eager "GradSync device buckets, world 1 (train's own figures): ${sync_line#summary: }"
fi

# ------------------------------------------------------------------ benchmarks
# at_size LOG BYTES: "time us, algbw, busbw" of an allreduce_bench-style table.
at_size() { awk -v b="$2" '$1 == b {print $2 " us, algbw " $3 " GB/s, busbw " $4 " GB/s"}' "$1"; }
busbw_at() { awk -v b="$2" '$1 == b {print $4}' "$1"; }
time_at() { awk -v b="$2" '$1 == b {print $2}' "$1"; }
if [ -n "$NO_GPU" ]; then
  skip allreduce-bench-nccl "$NO_GPU"
  skip nccl-abort-probe "$NO_GPU"
  skip gradsync-device-overhead "$NO_GPU"
else
  n=$NGPU
  [ "$n" -gt 8 ] && n=8
  log=$LOGS/allreduce-bench-nccl.log
  if brun env DDP_BACKEND=nccl "$BIN/ddprun" --no_prefix --nproc_per_node="$n" "$BIN/allreduce_bench" --max 268435456 > "$log" 2>&1 &&
     grep -q 'backend nccl' "$log"; then
    pass allreduce-bench-nccl
    info allreduce-bench-nccl "$n rank(s), device buffers; 256 MiB: $(at_size "$log" 268435456); 8 B: $(time_at "$log" 8) us"
    # The peer: torch.distributed's all_reduce on the same GPU(s), timed the same way.
    plog=$LOGS/allreduce-bench-torch.log
    if [ "$TORCH_GPUS" -lt 1 ]; then
      info allreduce-bench-nccl "no torch peer: ${HAVE_TORCH:-$NO_TORCH} has no CUDA"
    elif brun "$BIN/ddprun" --no_prefix --nproc_per_node="$n" "$BUNDLE/py/torch_allreduce_bench.py" --backend nccl --max-bytes 268435456 > "$plog" 2>&1 &&
         grep -q ' torch$' "$plog"; then
      ours=$(busbw_at "$log" 268435456) theirs=$(busbw_at "$plog" 268435456)
      info allreduce-bench-nccl "torch peer, same GPU(s): 256 MiB: $(at_size "$plog" 268435456); 8 B: $(time_at "$plog" 8) us; libddp/torch busbw at 256 MiB: $(awk -v a="$ours" -v b="$theirs" 'BEGIN {if (b > 0) printf "%.3f", a / b; else print "-"}')"
    else
      fail allreduce-bench-torch "$(last_words "$plog") (log: $plog)"
    fi
  else
    fail allreduce-bench-nccl "$(last_words "$log") (log: $log)"
  fi
  # What NCCL does when a peer dies (live recovery rests on it): ranks on GPU 0
  # as hosts of their own, over loopback sockets.
  log=$LOGS/nccl-abort-probe.log
  mkdir -p "$LOGS/nccl-abort-probe"
  if brun env NCCL_SOCKET_IFNAME=lo "$BIN/nccl_abort_probe" "$LOGS/nccl-abort-probe" > "$log" 2>&1; then
    pass nccl-abort-probe
    info nccl-abort-probe "$(grep -v '^\[\|^$\|NCCL' "$log" | tr -s ' ' | paste -sd ' ' -)"
  else
    fail nccl-abort-probe "$(last_words "$log") (log: $log)"
  fi
  log=$LOGS/gradsync-device.log
  if brun env DDP_BACKEND=nccl "$BIN/ddprun" --no_prefix --nproc_per_node="$n" "$BIN/gradsync_bench" --device > "$log" 2>&1 &&
     grep -q 'step without gradient sync' "$log"; then
    pass gradsync-device-overhead
    info gradsync-device-overhead "$(grep -m1 '^# gradsync_bench' "$log" | cut -c3-)"
    info gradsync-device-overhead "no sync: $(awk '/^step without gradient sync/ {print $5 " ms"}' "$log"); all-reduce alone: $(awk '/^all_reduce of all gradients alone/ {print $6 " ms"}' "$log")"
    while read -r cap mode buckets step ratio comm exposed; do
      info gradsync-device-overhead "cap $cap MiB $mode ($buckets buckets): step $step ms, ${ratio} of no sync, comm $comm ms, exposed $exposed ms"
    done < <(awk 'f && NF == 7 {print} /^ *cap\(MiB\)/ {f = 1}' "$log")
  else
    fail gradsync-device-overhead "$(last_words "$log") (log: $log)"
  fi
fi

# ------------------------------------------------------------------ --full (last: the
# headline checks above come first)
if [ "$FULL" = 1 ]; then
  for binary in nccl_tests grad_sync_tests train_integration_tests; do
    log=$LOGS/$binary.full.log
    if brun "$BIN/$binary" > "$log" 2>&1; then
      pass "gtest-all/$binary"
      info "gtest-all/$binary" "$(grep -E '^\[  PASSED  \]' "$log" | tail -1) $(grep -E '^\[  SKIPPED \] [0-9]' "$log" | tail -1)"
    else
      fail "gtest-all/$binary" "$(grep -c '^\[  FAILED  \] [A-Z]' "$log" || true) failing test(s) (log: $log)"
    fi
  done
fi

echo "gpu-check: $N_PASS passed, $N_FAIL failed, $N_SKIP skipped (summary: $SUMMARY)"
[ "$N_FAIL" = 0 ]
