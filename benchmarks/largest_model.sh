#!/usr/bin/env bash
# The largest GPT each strategy trains for 2 optimizer steps at 2 ranks on this machine (issue 15).
#   bash benchmarks/largest_model.sh [options]
# For each strategy (DDP, ZERO_1, ZERO_2, ZERO_3, ZERO_3+ckpt = ZeRO-3 with activation checkpointing),
# grows --d-model at a fixed shape (--layers, --heads, --seq, --batch) and prints a markdown table:
# parameters, per-rank peak RSS and PSS, the counted categories (activations included), `accel
# estimate-memory`'s prediction for the same shape and its error, and the step time. ZeRO-3 on one
# node keeps its parameters node-shared (the CPU default; ACCEL_NODE_SHARED_PARAMS=0 turns it off):
# every rank's RSS then counts the whole shared buffer, its PSS its share, so the error is PSS's
# (the node's peak PSS over the ranks) against estimate-memory's node-shared row. The search starts at the largest
# d_model estimate-memory predicts to fit the cap, gallops up or down from there, then bisects to
# --resolution, so each strategy takes a handful of runs.
#
# A run is step_bench --steps 1 --warmup 1 --json (2 optimizer steps) under the mpirun line of
# `accel launch --dry_run` (each rank on its share of the cores). A size that is killed (by the cap
# or by the kernel's out-of-memory killer) or fails is "too big", never the end of the script. The
# cap is on the sum of the ranks' memory:
#   - a cgroup v2 memory.max (with swap off) around mpirun, where /sys/fs/cgroup is cgroup v2 with the
#     memory controller and writable (root);
#   - always, a watchdog that sums the PSS (/proc/PID/smaps_rollup: each shared page split among the
#     processes mapping it, so node-shared memory counts once) of mpirun's session every 0.2 s, keeps
#     the largest sum, and kills the session past the cap (here, cgroup v1 with no memory controller
#     in the v2 hierarchy: the watchdog is the cap);
#   - sizes whose estimate-memory prediction is over 1.5x the per-rank cap are not run at all.
#
# Options (defaults in brackets):
#   --strategies "S ..."   [DDP ZERO_1 ZERO_2 ZERO_3 ZERO_3+ckpt]
#   --cap SIZE_GB          memory for all ranks together [90% of MemAvailable]
#   --ranks N              [2]
#   --layers L --heads H --seq T --batch B --vocab V   [20 16 64 1 4096]
#   --resolution D         d_model step of the final bisection, a multiple of --heads [128]
#   --min-d D              smallest d_model tried [--resolution]
#   --log FILE             every run's JSON line and failure reason [largest_model.log]
#   --offload DIR --d-model D   instead of the search: one run of ZeRO-3 + activation checkpointing with
#                          the optimizer state and the parameter shards in files under DIR (offload
#                          to nvme, issue 16) at d_model D, under the same cap; prints parameters, peak
#                          RSS per rank, bytes in files, bytes read/written per step and the step time
#   --sub-group-size N     elements stepped per optimizer sub-group with --offload [100000000]
#   --device cuda          on a GPU: each rank's CUDA caching allocator capped at --device-memory GB
#                          (step_bench --device_memory), 1 rank and --seq 512 unless given, and the
#                          strategies ZERO_3 (no offload), ZERO_3+opt (optimizer state in host memory,
#                          ZeRO-Offload), ZERO_3+ckpt+opt+param (with parameter shards in host memory
#                          and checkpointing, ZeRO-Infinity) and, with --offload DIR, ZERO_3+ckpt+opt+nvme
#                          (parameter shards in files under DIR); the table gives each one's size
#                          against no offload's, the device's peak and the host's, and the share of
#                          the step the GPU was busy at that size (every run on the GPU is profiled)
#   --device-memory GB     the per-rank device cap with --device cuda [8]
#   --step-in-backward     with --device cuda: the offloaded strategies (+opt) step their host optimizer
#                          during backward (step_bench --step-in-backward, ACCEL_STEP_IN_BACKWARD)
#   --start "S=D ..."      where strategy S's search starts (instead of estimate-memory's prediction):
#                          at a known answer it takes two runs, D passing and D + --resolution failing
#                          (six runs for the three strategies, the busy shares included). Sizes known
#                          to train at an 8 GB cap, batch 1 (H100/H200, 2026-11-27; only ZERO_3's was
#                          searched): --start "ZERO_3=1280 ZERO_3+opt=2304 ZERO_3+ckpt+opt+param=3200"
#   --max-d D | "S=D ..."  the search grows no strategy (or strategy S) past d_model D: one that still
#                          trains there is reported as ">= D" (ZeRO-Infinity's limit is the host's
#                          memory, several times what a short device lease can search). With --start
#                          S=D at the same D, one run confirms that D trains.
#   --deadline-s S         no run starts after S seconds from the script's start: a strategy still
#                          searching keeps what it found (">= D"), the ones not reached say so, and the
#                          table is printed (a lease's call ends at its limit with nothing)
# Small-scale trial (minutes, ~2 GB):
#   bash benchmarks/largest_model.sh --layers 2 --seq 32 --heads 4 --cap 2.5 --resolution 64
# The full table (the machine alone, ~20 GB, about an hour):
#   bash benchmarks/largest_model.sh
# A 3B GPT offloaded to disk (~50 GB free under DIR, tens of minutes):
#   bash benchmarks/largest_model.sh --offload /var/tmp/accel_offload --d-model 2560 --layers 38
# On a GPU, 8 GB per rank, with and without offload:
#   bash benchmarks/largest_model.sh --device cuda --device-memory 8 --offload /var/tmp/accel_offload
# STEP_BENCH and ACCEL_CLI override the binaries (default build/bin/step_bench, build/bin/accel).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${STEP_BENCH:-$ROOT/build/bin/step_bench}
CLI=${ACCEL_CLI:-$ROOT/build/bin/accel}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

STRATEGIES="DDP ZERO_1 ZERO_2 ZERO_3 ZERO_3+ckpt"
RANKS=2 LAYERS=20 HEADS=16 SEQ=64 BATCH=1 VOCAB=4096 RES=128 MIN_D="" CAP_GB="" LOG=largest_model.log
SIB="" OFFLOAD="" FIXED_D="" SUB_GROUP=100000000 DEVICE=cpu DEVICE_GB=8 RANKS_SET="" SEQ_SET="" STRATEGIES_SET="" START=""
MAX_D="" DEADLINE_S="" T_START=$(date +%s)
while [ $# -gt 0 ]; do
  case "$1" in
    --strategies) STRATEGIES=$2; STRATEGIES_SET=1; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    --device-memory|--device_memory) DEVICE_GB=$2; shift 2 ;;
    --cap) CAP_GB=$2; shift 2 ;;
    --ranks) RANKS=$2; RANKS_SET=1; shift 2 ;;
    --layers) LAYERS=$2; shift 2 ;;
    --heads) HEADS=$2; shift 2 ;;
    --seq) SEQ=$2; SEQ_SET=1; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --vocab) VOCAB=$2; shift 2 ;;
    --resolution) RES=$2; shift 2 ;;
    --min-d) MIN_D=$2; shift 2 ;;
    --log) LOG=$2; shift 2 ;;
    --offload) OFFLOAD=$2; shift 2 ;;
    --d-model) FIXED_D=$2; shift 2 ;;
    --sub-group-size) SUB_GROUP=$2; shift 2 ;;
    --start) START=$2; shift 2 ;;
    --max-d) MAX_D=$2; shift 2 ;;
    --deadline-s) DEADLINE_S=$2; shift 2 ;;
    --step-in-backward) SIB=1; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "largest_model.sh: unknown option '$1' (--help)" >&2; exit 2 ;;
  esac
done
case "$DEVICE" in
  cpu) ;;
  cuda)
    # (fp32 is fp32 here: an image's TF32 override would change the step times and busy shares)
    unset TORCH_ALLOW_TF32_CUBLAS_OVERRIDE
    [ -n "$RANKS_SET" ] || RANKS=1
    [ -n "$SEQ_SET" ] || SEQ=512
    if [ -z "$STRATEGIES_SET" ]; then
      STRATEGIES="ZERO_3 ZERO_3+opt ZERO_3+ckpt+opt+param"
      [ -n "$OFFLOAD" ] && STRATEGIES="$STRATEGIES ZERO_3+ckpt+opt+nvme"
    fi
    ;;
  *) echo "largest_model.sh: --device cpu or cuda, not '$DEVICE'" >&2; exit 2 ;;
esac
if [ -n "$FIXED_D" ] && { [ -z "$OFFLOAD" ] || [ "$DEVICE" != cpu ]; }; then
  echo "largest_model.sh: --d-model is the one size of the CPU's --offload DIR run; the search grows d_model itself (--start and --max-d bound it)" >&2
  exit 2
fi
if (( RES % HEADS != 0 )); then echo "largest_model.sh: --resolution $RES is not a multiple of --heads $HEADS" >&2; exit 2; fi
for kv in $START; do
  d=${kv#*=}
  if [[ "$kv" != *=* || ! "$d" =~ ^[0-9]+$ ]] || (( d % HEADS != 0 )) || [[ " $STRATEGIES " != *" ${kv%%=*} "* ]]; then
    echo "largest_model.sh: --start '$kv' must be STRATEGY=D with a strategy of '$STRATEGIES' and D a multiple of --heads $HEADS" >&2
    exit 2
  fi
done
MIN_D=${MIN_D:-$RES}
if [ -n "$DEADLINE_S" ] && [[ ! "$DEADLINE_S" =~ ^[0-9]+$ ]]; then
  echo "largest_model.sh: --deadline-s takes a whole number of seconds, not '$DEADLINE_S'" >&2
  exit 2
fi
# --max-d: one bound for every strategy, or S=D pairs.
declare -A MAX_OF
for kv in $MAX_D; do
  if [[ "$kv" =~ ^[0-9]+$ ]]; then
    for s in $STRATEGIES; do MAX_OF[$s]=$kv; done
    d=$kv
  else
    d=${kv#*=}
    if [[ "$kv" != *=* || ! "$d" =~ ^[0-9]+$ ]] || [[ " $STRATEGIES " != *" ${kv%%=*} "* ]]; then
      echo "largest_model.sh: --max-d '$kv' must be D or STRATEGY=D with a strategy of '$STRATEGIES'" >&2
      exit 2
    fi
    MAX_OF[${kv%%=*}]=$d
  fi
  if ((d % HEADS != 0)); then echo "largest_model.sh: --max-d $d is not a multiple of --heads $HEADS" >&2; exit 2; fi
done
# Whether the deadline (--deadline-s) has passed: no run starts after it.
past_deadline() { [ -n "$DEADLINE_S" ] && (($(date +%s) - T_START >= DEADLINE_S)); }
if [ -z "$CAP_GB" ]; then
  CAP_GB=$(awk '/MemAvailable/ {printf "%.1f", $2 * 1024 * 0.9 / 1e9}' /proc/meminfo)
fi
CAP_BYTES=$(awk -v g="$CAP_GB" 'BEGIN {printf "%.0f", g * 1e9}')
PER_RANK_BYTES=$((CAP_BYTES / RANKS))
# On a GPU the device's cap is what a size must fit (predictions are held against it); the host cap stays.
DEVICE_ARGS=()
if [ "$DEVICE" = cuda ]; then
  PER_RANK_BYTES=$(awk -v g="$DEVICE_GB" 'BEGIN {printf "%.0f", g * 1e9}')
  DEVICE_ARGS=(--device cuda --device_memory "$DEVICE_GB")
fi
: >"$LOG"

# A cgroup v2 memory.max, where one can be made.
CGROUP=""
if grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null &&
  mkdir "/sys/fs/cgroup/accel_largest_$$" 2>/dev/null; then
  CGROUP=/sys/fs/cgroup/accel_largest_$$
  if echo "$CAP_BYTES" >"$CGROUP/memory.max" 2>/dev/null; then
    echo 0 >"$CGROUP/memory.swap.max" 2>/dev/null || true
  else
    rmdir "$CGROUP"; CGROUP=""
  fi
fi
# A run that failed for a reason other than its size (an uncaught exception, a crash) leaves its reason in
# $FAILED_DIR/<strategy>: that strategy's search stops there and its row says so, rather than searching
# ever smaller sizes that fail the same way.
FAILED_DIR=$(mktemp -d)
cleanup() { rm -rf "$FAILED_DIR"; [ -n "$CGROUP" ] && rmdir "$CGROUP" 2>/dev/null; }
trap cleanup EXIT
# A run that did not start stops the whole search (run() is called in $(...): it signals this shell).
trap 'echo "largest_model.sh: stopped: a run did not start" >&2; exit 2' USR1
echo "cap: $CAP_GB GB for $RANKS ranks ($([ -n "$CGROUP" ] && echo "cgroup v2 memory.max + PSS watchdog" || echo "PSS watchdog"))" >&2

RUN_EXTRA=()  # (more step_bench arguments for every run: the profiled rerun on a GPU)
# run D STRATEGY: one step_bench run; prints its JSON line and returns 0, or returns 1 (too big / failed).
run() {
  local d=$1 s=$2 extra=() name=$2
  if [ "$s" = "ZERO_3+ckpt" ]; then name=ZERO_3; extra=(--checkpoint); fi
  if [ "$s" = "ZERO_3+ckpt+nvme" ]; then
    name=ZERO_3
    extra=(--checkpoint --offload-optimizer "$OFFLOAD" --offload-param "$OFFLOAD" --sub-group-size "$SUB_GROUP")
  fi
  case "$s" in  # (from a GPU: state in host memory, parameter shards in host memory or files)
    ZERO_3+opt) name=ZERO_3; extra=(--offload-optimizer cpu) ;;
    ZERO_3+ckpt+opt+param) name=ZERO_3; extra=(--checkpoint --offload-optimizer cpu --offload-param cpu) ;;
    ZERO_3+ckpt+opt+nvme) name=ZERO_3; extra=(--checkpoint --offload-optimizer cpu --offload-param "$OFFLOAD") ;;
  esac
  # (--step-in-backward: the strategies whose optimizer is in host memory step it during backward)
  if [ -n "$SIB" ] && [[ "$s" == *+opt* ]]; then extra+=(--step-in-backward); fi
  extra+=("${DEVICE_ARGS[@]}" "${RUN_EXTRA[@]}")
  # Sizes predicted far past the cap are not tried (the watchdog would kill them anyway).
  local p
  p=$(predict "$d" "$s")
  if [ -n "$p" ] && [ "$p" -gt $((PER_RANK_BYTES * 3 / 2)) ]; then
    echo "$s d=$d too big: predicted $((p / 1000000)) MB per rank, over 1.5x the cap, not run" >>"$LOG"
    echo "  $s d=$d: too big (predicted over 1.5x the cap, not run)" >&2
    return 1
  fi
  local out err
  out=$(mktemp) err=$(mktemp)
  (
    [ -n "$CGROUP" ] && echo $BASHPID >"$CGROUP/cgroup.procs"
    # accel launch's own mpirun line (cores and threads per rank as users get them), run without the
    # accel launch process itself, whose libtorch (~350 MB resident) would count against the cap.
    local cmd
    cmd=$("$CLI" launch --dry_run -n "$RANKS" "$BIN" --strategy "$name" "${extra[@]}" \
      --d-model "$d" --layers "$LAYERS" --heads "$HEADS" --seq "$SEQ" --batch "$BATCH" --vocab "$VOCAB" \
      --steps 1 --warmup 1 --json 2>/dev/null)
    [ -n "$cmd" ] || { echo "largest_model.sh: accel launch --dry_run gave no command" >&2; exit 2; }
    eval "exec setsid $cmd"
  ) >"$out" 2>"$err" &
  local pid=$! killed="" peak_pss=0
  sleep 0.2
  while kill -0 "$pid" 2>/dev/null; do
    local pss
    pss=$(session_pss "$pid")
    ((pss > peak_pss)) && peak_pss=$pss
    if [ "${pss:-0}" -gt "$CAP_BYTES" ]; then
      kill -KILL -- "-$pid" 2>/dev/null
      killed="over the cap ($((pss / 1000000)) MB PSS)"
    fi
    sleep 0.2
  done
  wait "$pid"
  local rc=$?
  local line
  line=$(grep '^{' "$out" | tail -1)
  if [ $rc -eq 0 ] && [ -n "$line" ]; then
    # (the watchdog's: every process of the run; a run shorter than its first sample: the ranks' PSS at the end)
    ((peak_pss > 0)) || peak_pss=$(echo "$line" | python3 -c 'import json, sys; print(int(json.load(sys.stdin)["node_pss"]))')
    line="${line%\}}, \"session_peak_pss\": $peak_pss}"
    echo "$s d=$d ok $line" >>"$LOG"
    echo "  $s d=$d: trains ($(echo "$line" | python3 -c 'import json, sys; j = json.load(sys.stdin); print("%.3fB parameters, %.1f s a step" % (j["params"] / 1e9, j["step_ms"] / 1e3))'))" >&2
    echo "$line"
    rm -f "$out" "$err"
    return 0
  fi
  # A run that did not start is not a size that did not fit: step_bench exits 2 with a line of its own
  # for a refused argument or device (e.g. "--device cuda but CUDA is not usable here"), CLI11 names
  # --help. Stop the search.
  if [ -z "$killed" ] && { { [ $rc -eq 2 ] && grep -q "^step_bench: \|^largest_model.sh: " "$err"; } ||
    grep -q "Run with --help" "$err"; }; then
    echo "largest_model.sh: $s d=$d did not start (rc $rc), so no size can be judged:" >&2
    { grep -m 3 "step_bench:\|--help\|largest_model.sh:" "$err" || tail -c 400 "$err"; } >&2
    rm -f "$out" "$err"
    kill -USR1 $$
    return 2
  fi
  [ -z "$killed" ] && grep -q "out of memory on the device" "$err" && killed="out of device memory (over the --device-memory cap)"
  # An exception nothing caught (SIGABRT, rc 134) or a crash (SIGSEGV, rc 139) that is not about memory
  # says nothing about the size: stop this strategy's search and show why. (A rank that mpirun saw fail
  # that way gives its own rc.)
  # (Not when anything says memory or disk ran out, or a process was killed: under the cgroup's limit one
  # rank is killed and its peer may throw on the broken link before mpirun ends it.)
  if [ -z "$killed" ] && [ $rc -ne 137 ] &&
    ! grep -qi "out of memory\|std::bad_alloc\|cannot allocate\|ALLOC_FAILED\|No space left\|killed\|signal 9" "$err" &&
    { [ $rc -eq 134 ] || [ $rc -eq 139 ] || grep -q "terminate called after throwing" "$err"; }; then
    local why
    why=$({ grep -m 1 "what():" "$err" || grep -m 1 "Segmentation fault\|Error" "$err"; } | sed 's/^ *//' | cut -c 1-200)
    why="rc $rc: ${why:-$(tail -c 200 "$err" | tr '\n' ' ')}"
    echo "$s d=$d failed (not its size): $why" >>"$LOG"
    echo "  $s d=$d: failed, not for its size ($why); $s not searched further" >&2
    echo "d_model $d: $why" >"$FAILED_DIR/$s"
    rm -f "$out" "$err"
    return 1
  fi
  [ -z "$killed" ] && { [ $rc -ge 128 ] || grep -qi "killed\|signal 9" "$err"; } && killed="killed (rc $rc: out of memory?)"
  echo "$s d=$d too big: ${killed:-failed, rc $rc: $(tail -c 300 "$err" | tr '\n' ' ')}" >>"$LOG"
  echo "  $s d=$d: too big (${killed:-rc $rc})" >&2
  rm -f "$out" "$err"
  return 1
}

# session_pss PID: the PSS of every process in session PID, summed, in bytes.
session_pss() {
  local p f total=0
  for p in $(ps -o pid= --sid "$1" 2>/dev/null); do
    f=$(awk '/^Pss:/ {print $2; exit}' "/proc/$p/smaps_rollup" 2>/dev/null)
    total=$((total + ${f:-0} * 1024))
  done
  echo "$total"
}

# Whether ZeRO-3 runs node-shared here: several ranks on this one machine talking through shared
# memory, unless switched off.
NODE_SHARED=0
((RANKS > 1)) && [ "${ACCEL_NODE_SHARED_PARAMS:-1}" != 0 ] && [ "${ACCEL_COMM_SHM:-1}" != 0 ] && NODE_SHARED=1

# predict D STRATEGY: estimate-memory's per-rank peak (bytes) for that shape. On a GPU the cap is the
# caching allocator's, which does not count the runtime: --overhead 0 there. The offloaded strategies
# from a GPU have their rows (--offload); ZeRO-3 offloaded to files from the CPU has none (empty).
predict() {
  local label ckpt=0 shared="" offload=none
  ((NODE_SHARED)) && shared=" node-shared"
  case "$2" in
    DDP) label="DDP" ;; ZERO_1) label="ZeRO-1" ;; ZERO_2) label="ZeRO-2" ;; ZERO_3) label="ZeRO-3$shared" ;;
    ZERO_3+ckpt) label="ZeRO-3$shared"; ckpt=1 ;;
    ZERO_3+opt) label="ZeRO-3"; offload=optimizer ;;
    ZERO_3+ckpt+opt+param | ZERO_3+ckpt+opt+nvme) label="ZeRO-3"; ckpt=1; offload=optimizer+params ;;
    *) return 0 ;;  # no prediction
  esac
  # (step_bench's attention: fused on CUDA, written out on the CPU)
  "$CLI" estimate-memory --d_model "$1" --layers "$LAYERS" --heads "$HEADS" --seq "$SEQ" --micro_batch "$BATCH" \
    --vocab "$VOCAB" --num_processes "$RANKS" --dtype fp32 --optimizer adamw --offload "$offload" \
    --attention "$([ "$DEVICE" = cuda ] && echo sdpa || echo eager)" $([ "$DEVICE" = cuda ] && echo --overhead 0) |
    awk -v l="$label" -v c="$ckpt" -v o="$offload" '
      { row = c ? l " + checkpointing" : l }
      # (the peak is the last column, or the one before "CPU GB" under offload)
      index($0, row " ") == 1 && (c || index($0, "checkpointing") == 0) {
        printf "%.0f", (o == "none" ? $(NF) : $(NF - 1)) * 1e9; exit }'
}

# The largest d (a multiple of RES) whose prediction fits the per-rank cap.
predicted_largest() {
  local lo=0 hi=$RES p
  [ -n "$(predict "$RES" "$1")" ] || { echo "$MIN_D"; return; }  # (no estimate)
  while p=$(predict "$hi" "$1") && [ "$p" -le "$PER_RANK_BYTES" ]; do lo=$hi; hi=$((hi * 2)); done
  while ((hi - lo > RES)); do
    local mid=$(((lo + hi) / 2 / RES * RES))
    if [ "$(predict "$mid" "$1")" -le "$PER_RANK_BYTES" ]; then lo=$mid; else hi=$mid; fi
  done
  echo $((lo > MIN_D ? lo : MIN_D))
}

# --offload: one fixed size, everything on disk.
if [ -n "$OFFLOAD" ] && [ "$DEVICE" = cuda ]; then
  mkdir -p "$OFFLOAD"
elif [ -n "$OFFLOAD" ]; then
  if [ -z "$FIXED_D" ]; then echo "largest_model.sh: --offload needs --d-model" >&2; exit 2; fi
  if ((FIXED_D % HEADS != 0)); then echo "largest_model.sh: --heads $HEADS does not divide --d-model $FIXED_D" >&2; exit 2; fi
  mkdir -p "$OFFLOAD"
  echo "ZeRO-3 + checkpointing + offload to $OFFLOAD at d_model $FIXED_D (writing the state to disk first)..." >&2
  t0=$(date +%s)
  if ! line=$(run "$FIXED_D" "ZERO_3+ckpt+nvme"); then
    echo "largest_model.sh: the offloaded run failed; see $LOG" >&2
    exit 1
  fi
  t1=$(date +%s)
  echo
  echo "$RANKS ranks, GPT --d-model $FIXED_D --layers $LAYERS --heads $HEADS --seq $SEQ --batch $BATCH --vocab $VOCAB, fp32 AdamW, 2 optimizer steps, ZeRO-3 + activation checkpointing + offload_optimizer/offload_param nvme ($OFFLOAD, sub_group_size $SUB_GROUP); cap $CAP_GB GB; $((t1 - t0)) s in all"
  echo
  echo "| parameters | peak RSS / rank | counted peak | params | grads | optim | gathered | activations | in files / rank | read / step / rank | written / step / rank | step s |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  echo "$line" | python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
gb = lambda k: "%.2f GB" % (j[k] / 1e9)
print("| %.2fB | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.1f |" % (
    j["params"] / 1e9, gb("peak_rss"), gb("counted_peak"), gb("parameters"), gb("gradients"), gb("optimizer"),
    gb("gathered"), gb("activations"), gb("disk_bytes"), gb("disk_read"), gb("disk_written"), j["step_ms"] / 1e3))'
  exit 0
fi

declare -A BEST NOTE  # NOTE: ">= " where a search stopped short of the answer (--max-d, --deadline-s); "late": none had trained
BASE_D=""
# On a GPU every run is profiled (step_bench --profile --profile-steps 2: 2 more steps under the
# profiler, after the timed ones), so that the largest size's run already says how busy the GPU was: no
# rerun for it. (The cap is the caching allocator's; the profiler's buffers are not in it.)
[ "$DEVICE" = cuda ] && RUN_EXTRA=(--profile --profile-steps 2)
for s in $STRATEGIES; do
  d0=""
  for kv in $START; do
    if [ "${kv%%=*}" = "$s" ]; then
      d0=${kv#*=}
      echo "$s: starting at d_model $d0 (--start)" >&2
    fi
  done
  if [ -z "$d0" ]; then
    d0=$(predicted_largest "$s")
    # A strategy without an estimate fits at least what the first strategy (no offload) fit.
    if [ "$DEVICE" = cuda ] && [ -n "$BASE_D" ] && [ -z "$(predict "$BASE_D" "$s")" ]; then d0=$BASE_D; fi
    echo "$s: estimate-memory predicts d_model $d0 fits $((PER_RANK_BYTES / 1000000)) MB per rank" >&2
  fi
  if past_deadline; then
    echo "$s: not searched (--deadline-s $DEADLINE_S passed)" >&2
    continue
  fi
  max_d=${MAX_OF[$s]:-}
  [ -n "$max_d" ] && ((d0 > max_d)) && d0=$max_d
  lo="" hi="" best="" runs=0 late=""
  # Gallop from the prediction until a pass and a failure bracket the answer (or --max-d stops it).
  step=$RES d=$d0
  while :; do
    if past_deadline; then late=1; break; fi
    runs=$((runs + 1))
    if line=$(run "$d" "$s"); then
      lo=$d best=$line
      [ -n "$hi" ] && break
      d=$((d + step))
      if [ -n "$max_d" ] && ((d > max_d)); then
        if ((lo >= max_d)); then NOTE[$s]=">= "; echo "$s: trains at --max-d $max_d; not searched further" >&2; break; fi
        d=$max_d
      fi
    else
      [ -f "$FAILED_DIR/$s" ] && break
      hi=$d
      [ -n "$lo" ] && break
      d=$((d - step))
      if ((d < MIN_D)); then break; fi
    fi
    step=$((step * 2))
  done
  # Bisect between them.
  while [ -n "$lo" ] && [ -n "$hi" ] && ((hi - lo > RES)); do
    mid=$(((lo + hi) / 2 / RES * RES))
    ((mid <= lo)) && break
    if past_deadline; then late=1; break; fi
    runs=$((runs + 1))
    if line=$(run "$mid" "$s"); then lo=$mid best=$line; else
      [ -f "$FAILED_DIR/$s" ] && break
      hi=$mid
    fi
  done
  if [ -n "$late" ]; then
    echo "$s: search stopped at --deadline-s $DEADLINE_S (trains at ${lo:-none of the sizes tried}${hi:+, not at $hi})" >&2
    NOTE[$s]=">= "
  fi
  if [ -z "$best" ]; then
    BEST[$s]="none|$runs"
    [ -n "$late" ] && NOTE[$s]="late"
    continue
  fi
  BEST[$s]="$best|$(predict "$lo" "$s")|$runs"
  [ -z "$BASE_D" ] && BASE_D=$lo
done

if [ "$DEVICE" = cuda ]; then
  # The share of the step the GPU was busy, at each strategy's largest size: its run's JSON
  # device_busy_share (kernels and copies) and device_compute_share (kernels alone), from the profiled
  # steps; one more run of that size where its JSON has none.
  declare -A BUSY
  busy_of() {
    python3 -c 'import json, sys
j = json.load(sys.stdin)
pct = lambda k: "%.0f%%" % (100 * j[k]) if j.get(k) is not None else "?"
print(pct("device_busy_share") + " / " + pct("device_compute_share"))'
  }
  for s in $STRATEGIES; do
    [ -n "${BEST[$s]:-}" ] || continue
    IFS='|' read -r json pred runs <<<"${BEST[$s]}"
    [ "$json" = none ] && continue
    [ -f "$FAILED_DIR/$s" ] && continue  # (its row shows the failure)
    BUSY[$s]=$(echo "$json" | busy_of)
    [ "${BUSY[$s]}" != "? / ?" ] && continue
    d=$(echo "$json" | python3 -c 'import json, sys; print(json.load(sys.stdin)["d_model"])')
    past_deadline && continue
    echo "$s: profiling d_model $d again for the GPU's busy share" >&2
    if line=$(run "$d" "$s"); then BUSY[$s]=$(echo "$line" | busy_of); fi
  done
  RUN_EXTRA=()
  echo
  echo "$RANKS rank(s) on a GPU capped at $DEVICE_GB GB each, GPT --layers $LAYERS --heads $HEADS --seq $SEQ --batch $BATCH --vocab $VOCAB, fp32 AdamW, 2 optimizer steps; host cap $CAP_GB GB; d_model to $RES"
  echo
  echo "| strategy | d_model | parameters | × first row | device peak / rank | host peak RSS / rank | host peak PSS / rank | step s | GPU busy / computing | runs |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  first=""
  for s in $STRATEGIES; do
    if [ -z "${BEST[$s]:-}" ]; then
      echo "| $s | not searched (deadline) | | | | | | | | |"
      continue
    fi
    IFS='|' read -r json pred runs <<<"${BEST[$s]}"
    if [ -f "$FAILED_DIR/$s" ]; then
      echo "| $s | a run failed, not for its size: $(tr '|' '/' <"$FAILED_DIR/$s") | | | | | | | | ${runs:-$pred} |"
      continue
    fi
    if [ "$json" = none ]; then
      if [ "${NOTE[$s]:-}" = late ]; then echo "| $s | none trained before the deadline | | | | | | | | $pred |"
      else echo "| $s | none fits from $MIN_D | | | | | | | | $pred |"; fi
      continue
    fi
    [ -z "$first" ] && first=$(echo "$json" | python3 -c 'import json, sys; print(json.load(sys.stdin)["params"])')
    python3 - "$s" "$json" "$runs" "$RANKS" "$first" "${BUSY[$s]:-?}" "${NOTE[$s]:-}" <<'EOF'
import json, sys
s, j, runs, ranks, first, busy, note = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), sys.argv[6], sys.argv[7]
gb = lambda b: f"{b / 1e9:.2f} GB"
print(f"| {s} | {note}{j['d_model']} | {j['params'] / 1e9:.3f}B | {j['params'] / first:.2f} | {gb(j['cuda_peak'])} | "
      f"{gb(j['peak_rss'])} | {gb(j['session_peak_pss'] / ranks)} | {j['step_ms'] / 1e3:.2f} | {busy} | {runs} |")
EOF
  done
  echo
  echo "GB = 1e9 bytes; device peak = the caching allocator's peak of allocated bytes (largest over ranks);"
  echo "× first row = parameters against the first strategy's (no offload); GPU busy / computing = the share of"
  echo "2 profiled steps' wall time the device ran kernels or copies / kernels alone (? where that run failed);"
  echo "\">=\": the search stopped there (--max-d or --deadline-s), the answer is that or more. Every run: $LOG"
  exit 0
fi

echo
echo "$RANKS ranks, GPT --layers $LAYERS --heads $HEADS --seq $SEQ --batch $BATCH --vocab $VOCAB, fp32 AdamW, 2 optimizer steps; cap $CAP_GB GB; d_model to $RES"
echo
echo "| strategy | d_model | parameters | peak RSS / rank | peak PSS / rank | counted peak | params | grads | optim | gathered | activations | estimate-memory | error | step s | runs |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for s in $STRATEGIES; do
  if [ -z "${BEST[$s]:-}" ]; then
    echo "| $s | not searched (deadline) | | | | | | | | | | | | | |"
    continue
  fi
  IFS='|' read -r json pred runs <<<"${BEST[$s]}"
  if [ -f "$FAILED_DIR/$s" ]; then
    echo "| $s | a run failed, not for its size: $(tr '|' '/' <"$FAILED_DIR/$s") | | | | | | | | | | | | | ${runs:-$pred} |"
    continue
  fi
  if [ "$json" = none ]; then
    if [ "${NOTE[$s]:-}" = late ]; then echo "| $s | none trained before the deadline | | | | | | | | | | | | | $pred |"
    else echo "| $s | none fits from $MIN_D | | | | | | | | | | | | | $pred |"; fi
    continue
  fi
  python3 - "$s" "$json" "$pred" "$runs" "$RANKS" "${NOTE[$s]:-}" <<'EOF'
import json, sys
s, j, pred, runs, ranks, note = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6]
gb = lambda b: f"{b / 1e9:.2f}"
pss = j["session_peak_pss"] / ranks  # the node's peak PSS (every process of the run) per rank
err = (pss - pred) / pred * 100
print(f"| {s} | {note}{j['d_model']} | {j['params'] / 1e9:.3f}B | {gb(j['peak_rss'])} GB | {gb(pss)} GB | "
      f"{gb(j['counted_peak'])} | {gb(j['parameters'])} | {gb(j['gradients'])} | {gb(j['optimizer'])} | "
      f"{gb(j['gathered'])} | {gb(j['activations'])} | {gb(pred)} GB | {err:+.1f}% | {j['step_ms'] / 1e3:.2f} | {runs} |")
EOF
done
echo
echo "GB = 1e9 bytes; the counted columns are the counting allocator's per-rank peaks (largest over ranks);"
echo "peak PSS / rank = the largest PSS sum of the run's processes (0.2 s samples) over $RANKS; error = (peak PSS /"
echo "rank - estimate) / estimate. ZeRO-3 rows$( ((NODE_SHARED)) && echo " are node-shared (their estimate: the node-shared row)" || echo " keep private shards")."
echo "Every run: $LOG"
