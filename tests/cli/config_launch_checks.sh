#!/usr/bin/env bash
# End-to-end checks of `accel config` and `accel launch`, run as a user would (the real binary, real
# mpirun). Usage: config_launch_checks.sh ACCEL_BIN SOURCE_DIR SCENARIO
# Each scenario exits 0 when every check in it passed, and prints what it saw otherwise.
# The script is also the program the ranks run: `config_launch_checks.sh _probe MODE OUT`.
set -uo pipefail

if [ "${1:-}" = "_probe" ]; then  # --- what each rank runs under accel launch ---------------------
  mode=$2 out=$3
  case "$mode" in
    env) echo "$RANK $LOCAL_RANK $NODE_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $NUM_NODES ${ACCEL_CONFIG_FILE:-none} ${ACCEL_MIXED_PRECISION:-none} ${ACCEL_ZERO_STAGE:-none}" > "$out/rank_$RANK" ;;
    fail) if [ "$RANK" = 2 ]; then sleep 0.5; exit 7; fi; exec sleep 60 ;;
    sleep) echo $$ > "$out/pid_$RANK.tmp" && mv "$out/pid_$RANK.tmp" "$out/pid_$RANK"; exec sleep 60 ;;
  esac
  exit 0
fi

ACCEL=$1 SRC=$2 SCENARIO=$3
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok:   $*"; }

# expect_error REGEX CMD...: CMD must exit non-zero and say REGEX (stdout+stderr).
expect_error() {
  local regex=$1; shift
  local out rc
  out=$("$@" 2>&1 </dev/null); rc=$?
  if [ $rc -ne 0 ] && grep -Eq -- "$regex" <<<"$out"; then pass "rc=$rc, says /$regex/: $*"
  else fail "expected a non-zero exit saying /$regex/ from: $*"; echo "  rc=$rc, output:"; sed 's/^/    /' <<<"$out"; fi
}

case "$SCENARIO" in
ranks)  # every rank sees its rank, local rank, node rank, the config and the flags
  "$ACCEL" launch --config_file "$SRC/configs/ddp.yaml" --num_processes 3 --mixed_precision bf16 \
      "$SELF" _probe env "$WORK" || fail "launch exited $?"
  cfg=$(realpath "$SRC/configs/ddp.yaml")
  for r in 0 1 2; do
    want="$r $r 0 3 3 1 $cfg bf16 none"
    got=$(cat "$WORK/rank_$r" 2>/dev/null)
    [ "$got" = "$want" ] && pass "rank $r: $got" || fail "rank $r saw '$got', expected '$want'"
  done
  # Without --num_processes the config's count (configs/deepspeed/zero2.yaml: 2) decides.
  rm -f "$WORK"/rank_*
  "$ACCEL" launch --config_file "$SRC/configs/deepspeed/zero2.yaml" --zero_stage 1 "$SELF" _probe env "$WORK" || fail "launch exited $?"
  n=$(ls "$WORK" | grep -c '^rank_')
  [ "$n" = 2 ] && pass "config's num_processes: 2 ranks" || fail "expected 2 ranks from the config, saw $n"
  grep -q ' 1$' "$WORK/rank_0" && pass "--zero_stage 1 reached the ranks" || fail "ACCEL_ZERO_STAGE: $(cat "$WORK/rank_0")"
  # Without Open MPI's two root variables: as root the launcher passes mpirun's own flag, and says so.
  rm -f "$WORK"/rank_*
  out=$(env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM "$ACCEL" launch --num_processes 2 \
        "$SELF" _probe env "$WORK" 2>&1) && pass "launch without OMPI_ALLOW_RUN_AS_ROOT (uid $(id -u))" \
    || { fail "launch without OMPI_ALLOW_RUN_AS_ROOT exited non-zero"; echo "$out"; }
  n=$(ls "$WORK" | grep -c '^rank_')
  [ "$n" = 2 ] && pass "both ranks ran" || fail "expected 2 ranks, saw $n"
  if [ "$(id -u)" = 0 ]; then
    grep -q "running as root: mpirun gets --allow-run-as-root" <<<"$out" && pass "the summary says so" || fail "no root line"
  else
    grep -q "running as root" <<<"$out" && fail "a root line as uid $(id -u)" || pass "no root line as uid $(id -u)"
  fi
  ;;
first_failure)  # rank 2 exits 7 while the others sleep: exit code 7, rank 2 named, nobody left running
  start=$(date +%s)
  out=$("$ACCEL" launch --num_processes 4 "$SELF" _probe fail "$WORK" 2>&1); rc=$?
  took=$(( $(date +%s) - start ))
  [ $rc -eq 7 ] && pass "exit code 7" || fail "exit code $rc, expected 7"
  grep -q "accel launch: rank 2 (node 0, local rank 2, host .*) failed first: it exited with code 7" <<<"$out" \
    && pass "names rank 2" || { fail "message does not name rank 2"; echo "$out"; }
  [ $took -lt 40 ] && pass "the sleeping ranks were stopped (${took}s)" || fail "took ${took}s: ranks were not stopped"
  ;;
interrupt)  # Ctrl-C: to the launcher alone, then to the whole process group (as a terminal sends it)
  for target in launcher group; do
    rm -f "$WORK"/pid_*
    setsid "$ACCEL" launch --num_processes 2 "$SELF" _probe sleep "$WORK" > "$WORK/launch.out" 2>&1 &
    lpid=$!
    for _ in $(seq 100); do [ -f "$WORK/pid_0" ] && [ -f "$WORK/pid_1" ] && break; sleep 0.2; done
    pids="$(cat "$WORK"/pid_* 2>/dev/null)"
    [ "$(wc -w <<<"$pids")" = 2 ] || { fail "$target: the ranks did not start"; cat "$WORK/launch.out"; kill -KILL -- -$lpid; continue; }
    if [ $target = launcher ]; then kill -INT $lpid; else kill -INT -- -$lpid; fi
    for _ in $(seq 100); do kill -0 $lpid 2>/dev/null || break; sleep 0.2; done
    if kill -0 $lpid 2>/dev/null; then fail "$target: launcher still running 20 s after SIGINT"; kill -KILL -- -$lpid; fi
    wait $lpid; rc=$?
    [ $rc -eq 130 ] && pass "$target: exit code 130" || fail "$target: exit code $rc, expected 130"
    grep -q "interrupted by Interrupt; stopped all 2 ranks" "$WORK/launch.out" && pass "$target: says interrupted" \
      || { fail "$target: no interrupt message"; cat "$WORK/launch.out"; }
    sleep 1
    for p in $pids; do kill -0 "$p" 2>/dev/null && { fail "$target: rank process $p still running"; kill -KILL "$p"; } || pass "$target: rank process $p gone"; done
  done
  # Ctrl-C while --min_nodes probes the hosts (each probe an mpirun that hangs here): accel stops them
  # and starts nothing.
  printf '#!/bin/sh\necho $$ > "%s/probe_$$"\nexec sleep 30\n' "$WORK" > "$WORK/slow_mpirun" && chmod +x "$WORK/slow_mpirun"
  printf 'node-a slots=1\nnode-b slots=1\n' > "$WORK/two_hosts"
  rm -f "$WORK"/probe_* "$WORK"/pid_*
  ACCEL_MPIRUN=$WORK/slow_mpirun setsid "$ACCEL" launch --hostfile "$WORK/two_hosts" --max_restarts 1 --min_nodes 1 \
    "$SELF" _probe sleep "$WORK" > "$WORK/launch.out" 2>&1 &
  lpid=$!
  for _ in $(seq 100); do [ "$(ls "$WORK"/probe_* 2>/dev/null | wc -l)" = 2 ] && break; sleep 0.1; done
  probes="$(cat "$WORK"/probe_* 2>/dev/null)"
  kill -INT $lpid
  for _ in $(seq 50); do kill -0 $lpid 2>/dev/null || break; sleep 0.1; done
  if kill -0 $lpid 2>/dev/null; then fail "probes: launcher still running 5 s after SIGINT"; kill -KILL -- -$lpid; fi
  wait $lpid; rc=$?
  [ $rc -eq 130 ] && grep -q "interrupted by Interrupt while probing the hosts; nothing started" "$WORK/launch.out" \
    && pass "Ctrl-C during the host probes: exit 130, nothing started" || { fail "probes: exit $rc"; cat "$WORK/launch.out"; }
  [ -z "$(ls "$WORK"/pid_* 2>/dev/null)" ] && pass "probes: no rank started" || fail "probes: a rank started"
  for p in $probes; do kill -0 "$p" 2>/dev/null && { fail "probe $p still running"; kill -KILL "$p"; } || pass "probe $p gone"; done
  ;;
launch_errors)  # bad input: a clear message and a non-zero exit, nothing started
  printf 'localhost slots=1\n' > "$WORK/one_slot"
  printf 'distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_stratgy: FULL_SHARD\n' > "$WORK/typo.yaml"
  printf 'distributed_type: [unclosed\n' > "$WORK/broken.yaml"
  expect_error "unknown flag '--bogus'" "$ACCEL" launch --bogus true
  expect_error "no program given" "$ACCEL" launch --num_processes 2
  expect_error "program 'no-such-program-xyz' not found on PATH" "$ACCEL" launch no-such-program-xyz
  expect_error "program './missing/train' not found" "$ACCEL" launch ./missing/train
  expect_error "2 processes on 1 machine\(s\) need 2 slots per host, but 'localhost' in .*one_slot has slots=1" \
    "$ACCEL" launch --hostfile "$WORK/one_slot" --num_processes 2 true
  expect_error "cannot read hostfile $WORK/nope" "$ACCEL" launch --hostfile "$WORK/nope" true
  expect_error "fsdp_sharding_stratgy.*did you mean.*fsdp_sharding_strategy" "$ACCEL" launch --config_file "$WORK/typo.yaml" true
  expect_error "broken.yaml" "$ACCEL" launch --config_file "$WORK/broken.yaml" true
  expect_error "mixed_precision.*fp12" "$ACCEL" launch --mixed_precision fp12 true
  expect_error "2 machines need --hostfile" "$ACCEL" launch --num_machines 2 --num_processes 2 true
  expect_error "num_processes: Value -1 not in range|--num_processes must be at least 1" "$ACCEL" launch --num_processes -1 true
  ;;
dry_run)  # the mpirun command for a hostfile: one app context per machine
  printf '# two hosts\nnode-a slots=2\nnode-b slots=2\n' > "$WORK/hosts"
  out=$("$ACCEL" launch --dry_run --hostfile "$WORK/hosts" --config_file "$SRC/configs/fsdp/hybrid_shard.yaml" \
        --num_processes 4 --num_machines 2 true 2>&1) || fail "dry run exited $?"
  grep -Eq -- "-np 2 --host node-a:2 .*/accel-rank --node_rank 0 --num_nodes 2 -- true : -np 2 --host node-b:2 .*--node_rank 1" <<<"$out" \
    && pass "two app contexts" || { fail "unexpected command"; echo "$out"; }
  grep -q "accel launch: 4 rank(s) on 2 machines (2 per machine) via mpirun" <<<"$out" && pass "summary line" || fail "no summary line"
  # A config that names no count (a DeepSpeed JSON never does) leaves it to the hostfile: 2 x 2 ranks.
  out=$("$ACCEL" launch --dry_run --hostfile "$WORK/hosts" --config_file "$SRC/configs/deepspeed/zero3.json" true 2>&1) ||
    fail "dry run exited $?"
  grep -q "accel launch: 4 rank(s) on 2 machines (2 per machine) via mpirun" <<<"$out" \
    && pass "the hostfile's slots and hosts, under a config without counts" || { fail "hostfile counts lost"; echo "$out"; }
  # --auto_resume wins over an ACCEL_AUTO_RESUME exported here, as the other flags win over theirs.
  out=$(ACCEL_AUTO_RESUME=0 "$ACCEL" launch --dry_run --auto_resume -n 1 true 2>&1) || fail "dry run exited $?"
  grep -q -- "-x ACCEL_AUTO_RESUME=1" <<<"$out" && ! grep -q "ACCEL_AUTO_RESUME=0" <<<"$out" \
    && pass "--auto_resume over an exported ACCEL_AUTO_RESUME=0" || { fail "--auto_resume lost"; echo "$out"; }
  # A config the program gets on its own command line, or through ACCEL_CONFIG_FILE, is named, not "no config file".
  export ACCEL_HOME=$WORK/empty_home  # (no default config there)
  out=$("$ACCEL" launch --dry_run -n 2 true --steps 3 --config_file my.yaml 2>&1) || fail "dry run exited $?"
  grep -q "via mpirun; the program's own --config_file my.yaml" <<<"$out" && pass "the program's --config_file named" \
    || { fail "the program's --config_file not named"; echo "$out"; }
  out=$(ACCEL_CONFIG_FILE=$SRC/configs/ddp.yaml "$ACCEL" launch --dry_run -n 2 true 2>&1) || fail "dry run exited $?"
  grep -q "via mpirun; config $SRC/configs/ddp.yaml" <<<"$out" && pass "ACCEL_CONFIG_FILE named" \
    || { fail "ACCEL_CONFIG_FILE not named"; echo "$out"; }
  out=$("$ACCEL" launch --dry_run -n 2 true 2>&1) || fail "dry run exited $?"
  grep -q "via mpirun; no config file" <<<"$out" && pass "no config file" || { fail "no config: line"; echo "$out"; }
  # NCCL's, Python's, UCX's and MLflow's variables reach the other machines (-x), as under DeepSpeed's launcher.
  out=$(NCCL_SOCKET_IFNAME=eth0 PYTHONPATH=/src MLFLOW_TRACKING_URI=file:/m "$ACCEL" launch --dry_run --hostfile "$WORK/hosts" true 2>&1) \
    || fail "dry run exited $?"
  grep -q -- "-x NCCL_SOCKET_IFNAME=eth0" <<<"$out" && grep -q -- "-x PYTHONPATH=/src" <<<"$out" \
    && grep -q -- "-x MLFLOW_TRACKING_URI=file:/m" <<<"$out" && pass "NCCL_*, PYTHON*, MLFLOW_* forwarded" \
    || { fail "variables not forwarded"; echo "$out"; }
  # --launcher_args split as a shell splits them: a quoted value stays one word.
  out=$("$ACCEL" launch --dry_run -n 1 --launcher_args "--mca plm_rsh_args '-p 2222' -x FOO=\"a b\"" true 2>&1) \
    || fail "dry run exited $?"
  grep -q -- "--mca plm_rsh_args '-p 2222' -x 'FOO=a b'" <<<"$out" && pass "--launcher_args quoted words kept" \
    || { fail "--launcher_args split wrongly"; echo "$out"; }
  # A hostfile's third host, not used: its slots do not count.
  printf 'h1 slots=2\nh2 slots=2\nh3 slots=2\n' > "$WORK/hosts3"
  out=$("$ACCEL" launch --dry_run --hostfile "$WORK/hosts3" --num_machines 2 true 2>&1) || fail "dry run exited $?"
  grep -q "accel launch: 4 rank(s) on 2 machines (2 per machine)" <<<"$out" && pass "2 of 3 hosts: 4 ranks" \
    || { fail "2 of 3 hosts"; echo "$out"; }
  ;;
config_flow)  # config (questions on stdin) -> default location -> explain -> launch picks it up
  export ACCEL_HOME=$WORK/home
  printf '1\n2\nyes\nzero3\nnone\nnone\n1.0\n1\nno\n' | "$ACCEL" config > "$WORK/q.out" 2>&1 || { fail "accel config exited $?"; cat "$WORK/q.out"; }
  [ -f "$ACCEL_HOME/default_config.yaml" ] && pass "wrote \$ACCEL_HOME/default_config.yaml" || fail "no default config written"
  grep -q "DeepSpeed ZeRO stage 3" "$WORK/q.out" && pass "config explains what it wrote" || { fail "no explanation"; cat "$WORK/q.out"; }
  out=$("$ACCEL" config explain 2>&1) || fail "explain of the default config exited $?"
  grep -q "1/2 of it (sharded over all 2 ranks)" <<<"$out" && pass "explain: sharded over 2 ranks" || { fail "explain"; echo "$out"; }
  out=$("$ACCEL" launch --dry_run true 2>&1) || fail "launch --dry_run exited $?"
  grep -q "2 rank(s) on 1 machine via mpirun; config $ACCEL_HOME/default_config.yaml" <<<"$out" \
    && pass "launch uses the default config" || { fail "launch did not use the default config"; echo "$out"; }
  expect_error "exists; left as it is" "$ACCEL" config default
  "$ACCEL" config default --force > /dev/null 2>&1 && grep -q "distributed_type: NO" "$ACCEL_HOME/default_config.yaml" \
    && pass "config default --force overwrote it" || fail "config default --force"
  "$ACCEL" config default --config_file "$WORK/sub/dir/c.yaml" --mixed_precision bf16 > /dev/null 2>&1 \
    && grep -q "mixed_precision: 'bf16'" "$WORK/sub/dir/c.yaml" && pass "config default --config_file in a new directory" \
    || fail "config default --config_file"
  ;;
config_errors)
  export ACCEL_HOME=$WORK/home
  printf 'distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 5\n' > "$WORK/stage5.yaml"
  expect_error "input ended before the questions did" "$ACCEL" config
  [ ! -e "$ACCEL_HOME/default_config.yaml" ] && pass "nothing written after a failed questionnaire" || fail "a file was written"
  expect_error "stage5.yaml.*zero_stage" "$ACCEL" config explain "$WORK/stage5.yaml"
  expect_error "cannot|not found|No such file|does not exist" "$ACCEL" config explain "$WORK/missing.yaml"
  expect_error "mixed_precision: fp9 not in" "$ACCEL" config default --mixed_precision fp9
  expect_error "The following argument was not expected: --bogus|--bogus" "$ACCEL" config explain --bogus
  ;;
binding)  # each rank gets its share of the cores (mpirun flags, the CPUs it reports) and as many threads
  unset OMP_NUM_THREADS  # (the test environment sets 1; the default is what is checked first)
  # The cores independently of accel: this process's CPU list and sysfs's (package, core) of each.
  cpus=$(awk '/^Cpus_allowed_list/ {print $2}' /proc/self/status | tr ',' '\n' |
         awk -F- '{ e = (NF > 1 ? $2 : $1); for (c = $1; c <= e; ++c) print c }')
  C=$(for c in $cpus; do t=/sys/devices/system/cpu/cpu$c/topology
        echo "$(cat $t/physical_package_id 2>/dev/null || echo $c):$(cat $t/core_id 2>/dev/null || echo $c)"; done | sort -u | wc -l)
  ncpu=$(wc -w <<<"$cpus")
  echo "this process: $ncpu CPU(s), $C physical core(s)"
  # rank_line N OUT R: rank R's line from `accel env` output OUT
  rank_line() { grep -E "^  rank $2/" <<<"$1"; }
  out=$("$ACCEL" launch --dry_run -n 1 true 2>&1)
  grep -q -- "--map-by ppr:1:node:PE=$C --bind-to core -x OMP_NUM_THREADS=$C " <<<"$out" \
    && pass "-n 1: bound to all $C cores, $C threads (flags)" || { fail "-n 1 flags"; echo "$out"; }
  out=$("$ACCEL" launch -n 1 "$ACCEL" env 2>&1) || fail "accel env -n 1 exited $?"
  line=$(rank_line "$out" 0)
  grep -q "($C core(s)) intra-op threads $C$" <<<"$line" && pass "-n 1: rank 0 runs on $C cores with $C threads" \
    || { fail "-n 1: rank 0 reports '$line'"; echo "$out"; }
  out=$(OMP_NUM_THREADS=1 "$ACCEL" launch -n 1 "$ACCEL" env 2>&1) || fail "OMP_NUM_THREADS=1 accel env exited $?"
  grep -q "($C core(s)) intra-op threads 1$" <<<"$(rank_line "$out" 0)" && grep -q "1 intra-op thread(s) per rank (your OMP_NUM_THREADS)" <<<"$out" \
    && pass "the user's OMP_NUM_THREADS=1 is kept" || { fail "OMP_NUM_THREADS=1 not kept"; echo "$out"; }
  if [ "$C" -ge 2 ]; then
    P=$((C / 2))
    out=$("$ACCEL" launch -n 2 "$ACCEL" env 2>&1) || fail "accel env -n 2 exited $?"
    grep -q -- "--map-by ppr:2:node:PE=$P --bind-to core" <<<"$("$ACCEL" launch --dry_run -n 2 true 2>&1)" \
      && pass "-n 2: PE=$P flags" || fail "-n 2 flags"
    l0=$(rank_line "$out" 0) l1=$(rank_line "$out" 1)
    grep -q "($P core(s)) intra-op threads $P$" <<<"$l0" && grep -q "($P core(s)) intra-op threads $P$" <<<"$l1" \
      && pass "-n 2: each rank on $P core(s) with $P thread(s)" || { fail "-n 2 ranks"; echo "$out"; }
    s0=$(sed -E 's/.* cpus ([^ ]+) .*/\1/' <<<"$l0") s1=$(sed -E 's/.* cpus ([^ ]+) .*/\1/' <<<"$l1")
    [ "$s0" != "$s1" ] && pass "-n 2: the ranks' CPU sets differ ($s0 | $s1)" || fail "-n 2: both ranks on $s0"
  fi
  if [ "$C" -le 8 ]; then  # oversubscribed: more ranks than cores
    N=$((C + 2))
    out=$("$ACCEL" launch -n $N "$ACCEL" env 2>&1) || fail "accel env -n $N exited $?"
    grep -q -- "--bind-to none -x OMP_NUM_THREADS=1 " <<<"$("$ACCEL" launch --dry_run -n $N true 2>&1)" \
      && pass "-n $N: not bound, 1 thread (flags)" || fail "-n $N flags"
    unbound=$(grep -cE "^  rank [0-9]+/$N .*\($C core\(s\)\) intra-op threads 1$" <<<"$out")
    [ "$unbound" -eq "$N" ] && pass "-n $N: all $N ranks unbound (all $C cores) with 1 thread" \
      || { fail "-n $N: $unbound of $N ranks unbound with 1 thread"; echo "$out"; }
  fi
  ;;
explain_shipped)  # every shipped config explains without error, and holds only keys that act here
  for f in $(cd "$SRC" && ls configs/*.yaml configs/*/*.yaml configs/*/*.json); do
    out=$("$ACCEL" config explain "$SRC/$f" 2>&1) && grep -q "^Strategy" <<<"$out" && grep -q "^Ignored keys  none$" <<<"$out" \
      && pass "$f" || { fail "$f"; echo "$out"; }
  done
  # `accel config --config_file F explain` explains F (Accelerate's `accelerate config --config_file`).
  out=$(ACCEL_HOME=$WORK/empty_home "$ACCEL" config --config_file "$SRC/configs/fsdp/full_shard.yaml" explain 2>&1) \
    && grep -q "^Strategy.*FULL_SHARD" <<<"$out" && pass "config --config_file F explain" \
    || { fail "config --config_file F explain"; echo "$out"; }
  expect_error "two files to explain" "$ACCEL" config --config_file "$SRC/configs/ddp.yaml" explain \
    "$SRC/configs/fsdp/full_shard.yaml"
  ;;
*) echo "unknown scenario '$SCENARIO'"; exit 2 ;;
esac
[ $failures -eq 0 ] && echo "PASSED: $SCENARIO" || echo "FAILED: $SCENARIO ($failures)"
[ $failures -eq 0 ]
