#!/usr/bin/env bash
# A job that loses a host goes on with the hosts that are left (`accel launch --min_nodes`). Run under
# multinode_netns.sh, which makes the two hosts (network namespaces joined by a veth pair):
#
#   multinode_netns.sh multinode_shrink.sh ACCEL_CLI GPT_LM SOURCE_DIR OUT_DIR [STEPS]
#
# 1. The reference: STEPS steps of the GPT example in float64 under ZeRO-3 at 4 ranks, uninterrupted
#    (one host, `accel launch -n 4`).
# 2. The same training on 2 hosts x 2 ranks under `accel launch --hostfile --max_restarts 1
#    --min_nodes 1 --auto_resume`, a checkpoint every 10 steps. Once it is past step KILL_AT, both ranks
#    of host 1 are SIGKILLed (the host "dies"). accel launch must drop host 1, start the job again on
#    host 0's 2 ranks with twice the gradient accumulation (the global batch unchanged), and those
#    ranks resume from the newest checkpoint (saved at 4 ranks, resharded on load) and finish.
# 3. Checks: the job ends by itself (exit 0); the log says which host was dropped and why, the 2-rank
#    restart and the accumulation; the restarted ranks ran on host 0 only with accumulation 2 (the
#    example's --comm_stats); the loss log holds every step once; every loss, the final one included,
#    is within 1e-5 relative of the uninterrupted 4-rank run's.
set -uo pipefail
ACCEL_CLI=$1 GPT=$2 SRC=$3 OUT=$4 STEPS=${5:-120}
HERE=$(cd "$(dirname "$0")" && pwd)
: "${ACCEL_MN_NS0:?run under multinode_netns.sh}"
CONFIG=$SRC/configs/deepspeed/zero3.yaml
KILL_AT=${ACCEL_MN_KILL_AT:-25}
RUN_TIMEOUT=${ACCEL_MN_RUN_TIMEOUT:-300}
RTOL=1e-5
rm -rf "$OUT" && mkdir -p "$OUT" && cd "$OUT" || exit 1
unset ACCEL_RANKS_PER_NODE  # real nodes: the topology comes from Open MPI
errors=0
fail() { echo "FAIL: $*"; errors=$((errors + 1)); }
pass() { echo "ok:   $*"; }

train=(--config_file "$CONFIG" --float64 --seed 3 --steps "$STEPS")
echo "== reference: accel launch -n 4 (one host), ZeRO-3, float64, $STEPS steps"
if ! timeout "$RUN_TIMEOUT" "$ACCEL_CLI" launch -n 4 "$GPT" "${train[@]}" --log_file ref.log > ref.out 2>&1; then
  echo "FAIL: the reference run failed:"; tail -5 ref.out; exit 1
fi

echo "== 2 hosts x 2 ranks, --max_restarts 1 --min_nodes 1 --auto_resume; host 1 killed after step $KILL_AT"
source "$HERE/multinode_mpi_env.sh"
mn_hostfile hostfile
mpi_env=("${mn_mpi_env[@]}")
t0=$(date +%s)
"$HERE/multinode_enter.sh" "$ACCEL_MN_NS0" env "${mpi_env[@]}" timeout "$RUN_TIMEOUT" \
  "$ACCEL_CLI" launch --hostfile hostfile --num_machines 2 --num_processes 4 --max_restarts 1 --min_nodes 1 --auto_resume \
  "$GPT" "${train[@]}" --project_dir p --checkpointing_steps 10 --total_limit 2 --log_file shrink.log \
  --comm_stats shrink.stats > shrink.out 2>&1 &
job=$!
last_step() { tail -1 shrink.log 2> /dev/null | awk 'END { print $2 + 0 }'; }
for _ in $(seq 3000); do [ "$(last_step)" -ge "$KILL_AT" ] && break; kill -0 $job 2> /dev/null || break; sleep 0.02; done
victims=()
for p in $(ip netns pids "$ACCEL_MN_NS1" 2> /dev/null); do
  [ "$(cat /proc/"$p"/comm 2> /dev/null)" = "$(basename "$GPT")" ] && victims+=("$p")
done
killed_at=$(last_step)
if [ ${#victims[@]} = 2 ]; then
  kill -KILL "${victims[@]}"
  pass "host 1's 2 ranks (pids ${victims[*]}) SIGKILLed at step $killed_at"
else
  fail "expected 2 ranks on host 1 at step $killed_at, found ${#victims[@]}"
fi
wait $job
rc=$?
echo "(elastic run: $(($(date +%s) - t0)) s; its output: $OUT/shrink.out)"
sed -n '/accel launch:/p;/resumed from/p;/ranks this job started with/p' shrink.out | sed 's/^/    /'
[ $rc = 0 ] && pass "the job ended by itself (exit 0)" || { fail "the job exited $rc"; tail -20 shrink.out; }

expect_line() {  # expect_line DESCRIPTION REGEX
  if grep -Eq "$2" shrink.out; then pass "$1"; else fail "$1: no line matching /$2/"; fi
}
expect_line "host 1 dropped for its killed rank" "accel launch: dropped $ACCEL_MN_IP1 \(rank [23] was killed by signal 9 first\); 1 of 2 host\(s\)"
expect_line "started again on 2 ranks of host 0" "accel launch: 2 rank\(s\) on 1 of the 2 machines it started on; the ranks accumulate 2x"
expect_line "the restart counted" "accel launch: the job failed .*restart 1 of 1"
expect_line "gradient accumulation doubled" "running on 2 of the 4 ranks this job started with: gradient accumulation 1 -> 2"
resumed=$(sed -n 's/.*accel: resumed from .*checkpoint_[0-9]* at step \([0-9]*\).*/\1/p' shrink.out | tail -1)
if [ -n "$resumed" ] && [ "$resumed" -le "$killed_at" ] && [ $((resumed % 10)) = 0 ] && [ "$resumed" -gt 0 ]; then
  pass "resumed at step $resumed (the newest checkpoint before the kill at step $killed_at)"
else
  fail "resumed at step '${resumed}' (kill at step $killed_at, a checkpoint every 10 steps)"
fi

# The restarted job's ranks: world 2, one node, host 0's namespace, accumulation 2.
ns0=$(stat -L -c %i "/var/run/netns/$ACCEL_MN_NS0")
get() { awk -v r="$1" -v k="$2" '{ delete kv; for (i = 1; i <= NF; ++i) { split($i, p, "="); kv[p[1]] = p[2] }
                                    if (kv["rank"] == r) { print kv[k]; exit } }' shrink.stats; }
for r in 0 1; do
  got="$(get $r world_size)/$(get $r num_nodes)/$(get $r netns)/$(get $r accumulation)"
  [ "$got" = "2/1/$ns0/2" ] && pass "rank $r after the restart: world 2, 1 node, host 0, accumulation 2" \
    || fail "rank $r after the restart: world/nodes/netns/accumulation $got, expected 2/1/$ns0/2"
done
[ "$(wc -l < shrink.stats 2> /dev/null)" = 2 ] || fail "comm stats from $(wc -l < shrink.stats 2> /dev/null) ranks, expected 2"

awk -v rtol="$RTOL" -v steps="$STEPS" '
  NR == FNR { ref[$2] = $4; next }
  { n++; if ($2 != n) { printf "FAIL: line %d of the loss log is step %s\n", n, $2; bad = 1 }
    d = $4 - ref[$2]; if (d < 0) d = -d; r = d / (ref[$2] < 0 ? -ref[$2] : ref[$2]); if (r > worst) worst = r
    if (r > rtol) { printf "FAIL: step %d loss %.17g vs %.17g uninterrupted\n", $2, $4, ref[$2]; bad = 1 }
    last = $4; lastref = ref[$2] }
  END { if (n != steps) { printf "FAIL: %d loss lines, expected %d\n", n, steps; bad = 1 }
        printf "loss: every step once (%d); final %.17g vs %.17g uninterrupted at 4 ranks; worst relative difference %.2e (tolerance %s)\n",
               n, last, lastref, worst, rtol
        exit bad }' ref.log shrink.log && pass "losses follow the uninterrupted 4-rank run" || fail "losses"

# 4. A host that does not answer the start-up probe (an address no namespace has: the rsh agent cannot
#    reach it) is dropped before the first start: the job runs on host 0's 2 ranks with the 4-rank
#    global batch from step 1.
echo "== hostfile with an unreachable second host: dropped by the start-up probe"
printf '%s slots=2\n10.213.7.99 slots=2\n' "$ACCEL_MN_IP0" > hostfile_dead
"$HERE/multinode_enter.sh" "$ACCEL_MN_NS0" env "${mpi_env[@]}" ACCEL_HOST_PROBE_TIMEOUT_S=20 timeout "$RUN_TIMEOUT" \
  "$ACCEL_CLI" launch --hostfile hostfile_dead --num_machines 2 --num_processes 4 --max_restarts 1 --min_nodes 1 \
  "$GPT" --config_file "$CONFIG" --float64 --seed 3 --steps 10 --log_file probe.log > probe.out 2>&1
rc=$?
[ $rc = 0 ] && pass "the job with an unreachable host ran (exit 0)" || { fail "it exited $rc"; tail -5 probe.out; }
if grep -Eq "accel launch: dropped 10.213.7.99 \((the start-up probe failed|no answer to the start-up probe)" probe.out &&
  grep -q "accel launch: 2 rank(s) on 1 of the 2 machines" probe.out; then
  pass "$(grep "accel launch: dropped" probe.out)"
else
  fail "no line saying the unreachable host was dropped by the probe"; grep "accel launch" probe.out
fi
if awk 'NR == FNR { ref[$2] = $4; next } { d = $4 - ref[$2]; if (d < 0) d = -d; if (d / ref[$2] > 1e-5) bad = 1 }
       END { exit bad || FNR != 10 }' ref.log probe.log; then
  pass "its 10 losses are within 1e-5 of the uninterrupted 4-rank run's"
else
  fail "its losses differ from the 4-rank run's"
fi

if [ "$errors" -gt 0 ]; then
  echo "FAILED: $errors check(s); runs in $OUT"
  exit 1
fi
rm -rf p
echo "PASSED: the job lost host 1 at step $killed_at and finished on host 0's 2 ranks from step $resumed, global batch unchanged"
