#!/usr/bin/env bash
# Real multi-node HYBRID_SHARD on one machine. Run under multinode_netns.sh, which makes the two hosts
# (network namespaces joined by a veth pair) and exports ACCEL_MN_*:
#
#   multinode_netns.sh multinode_hybrid_shard.sh ACCEL_CLI GPT_LM SOURCE_DIR OUT_DIR MPIEXEC [STEPS]
#
# 1. `accel launch --hostfile` (run on host 0: multinode_enter.sh) starts 2 x 2 ranks of the GPT example
#    under configs/fsdp/hybrid_shard.yaml; Open MPI reaches host 1 through multinode_rsh_agent.sh
#    instead of ssh, and talks TCP over the veth only.
# 2. The same training with one namespace and simulated nodes (ACCEL_RANKS_PER_NODE=2, mpirun -np 4).
# 3. Checks, from the example's --comm_stats file (one line per rank) and loss log:
#    - the ranks ran on two hosts: node = rank / 2, and each rank's network namespace is its host's;
#    - cross-node bytes: the replicate (cross-node) group of each rank all-reduces its gradient shard
#      of every unit once per optimizer step, in fp32, so per rank, sent and received alike,
#          steps * 4 * sum_units ceil(numel(unit) / 2)        (shard group of 2 ranks, align 1)
#      with numel(root) = vocab*d + seq*d + 2d (tok, pos, ln_f) and numel(block) = 12d^2 + 10d,
#      from the model's config, not from the engine; one all-reduce per unit per step. "Cross-node
#      bytes" means this: the replicate group's counted payload, all of which crosses (its two
#      members are on different hosts). World collectives cross too, by an amount that depends on
#      Open MPI's algorithm, so they are checked by their own formulas and in the veth bound instead;
#    - world collectives (all 4 ranks, so across nodes too): the initial broadcast of rank 0's
#      weights (a multiple of 4 * params bytes, at least one copy) and the per-step loss reduce;
#    - the veth really carried it: each host's tx bytes >= its ranks' cross-node sent bytes (+ one
#      copy of the weights from host 0), a lower bound (TCP/IP headers and Open MPI's own traffic add);
#    - the loss trajectory is finite, decreases, and equals the simulated-nodes run's;
#    - the simulated run counts the same replicate and shard bytes.
set -euo pipefail
ACCEL_CLI=$1 GPT=$2 SRC=$3 OUT=$4 MPIEXEC=$5 STEPS=${6:-20}
HERE=$(cd "$(dirname "$0")" && pwd)
: "${ACCEL_MN_NS0:?run under multinode_netns.sh}"
CONFIG=$SRC/configs/fsdp/hybrid_shard.yaml
RUN_TIMEOUT=${ACCEL_MN_RUN_TIMEOUT:-240}
mkdir -p "$OUT"
rm -f "$OUT"/real.* "$OUT"/sim.*
unset ACCEL_RANKS_PER_NODE  # real nodes: the topology comes from Open MPI

fail() {
  echo "FAIL: $*"
  exit 1
}

# --- 1. two hosts, 2 x 2 ranks --------------------------------------------------------------------
source "$HERE/multinode_mpi_env.sh"  # mn_hostfile, mn_mpi_env (what each setting is for: there)
mn_hostfile "$OUT/hostfile"
mpi_env=("${mn_mpi_env[@]}")
tx() { ip netns exec "$1" cat "/sys/class/net/$ACCEL_MN_IF/statistics/tx_bytes"; }
tx0_before=$(tx "$ACCEL_MN_NS0") tx1_before=$(tx "$ACCEL_MN_NS1")
train_args=(--steps "$STEPS" --seed 3)
echo "== real: accel launch --hostfile (2 hosts x 2 ranks), HYBRID_SHARD"
cmd=("$ACCEL_CLI" launch --hostfile "$OUT/hostfile" --num_machines 2 --num_processes 4 --config_file "$CONFIG"
     "$GPT" "${train_args[@]}" --log_file "$OUT/real.log" --comm_stats "$OUT/real.stats")
echo "multinode_enter.sh $ACCEL_MN_NS0 env ${mpi_env[*]} ${cmd[*]}"
t0=$(date +%s)
status=0
"$HERE/multinode_enter.sh" "$ACCEL_MN_NS0" env "${mpi_env[@]}" timeout "$RUN_TIMEOUT" "${cmd[@]}" 2>&1 | tee "$OUT/real.out" ||
  status=$?
[ "$status" = 0 ] || fail "the 2-host run exited with $status (output: $OUT/real.out)"
echo "(2-host run: $(($(date +%s) - t0)) s)"
tx0=$(($(tx "$ACCEL_MN_NS0") - tx0_before)) tx1=$(($(tx "$ACCEL_MN_NS1") - tx1_before))

# --- 2. one host, simulated nodes -----------------------------------------------------------------
echo "== simulated: mpirun -np 4, ACCEL_RANKS_PER_NODE=2, HYBRID_SHARD"
ACCEL_RANKS_PER_NODE=2 timeout "$RUN_TIMEOUT" "$MPIEXEC" --oversubscribe -np 4 "$GPT" --config_file "$CONFIG" \
  "${train_args[@]}" --log_file "$OUT/sim.log" --comm_stats "$OUT/sim.stats" > "$OUT/sim.out" 2>&1 ||
  fail "the simulated-nodes run failed (output: $OUT/sim.out): $(tail -5 "$OUT/sim.out")"

# --- 3. checks ------------------------------------------------------------------------------------
# get FILE RANK KEY: the value of KEY on RANK's line (0 when the key is absent: a zero count).
get() { awk -v r="$2" -v k="$3" '{ delete kv; for (i = 1; i <= NF; ++i) { split($i, p, "="); kv[p[1]] = p[2] }
                                  if (kv["rank"] == r) { print (k in kv) ? kv[k] : 0; exit } }' "$1"; }
errors=0
check() {  # check DESCRIPTION GOT EXPECTED
  if [ "$2" = "$3" ]; then echo "ok: $1 = $2"; else echo "FAIL: $1 = $2, expected $3"; errors=$((errors + 1)); fi
}
check_ge() {  # check_ge DESCRIPTION GOT BOUND
  if [ "$2" -ge "$3" ]; then echo "ok: $1 = $2 >= $3"; else echo "FAIL: $1 = $2, expected >= $3"; errors=$((errors + 1)); fi
}
for f in real sim; do
  [ -s "$OUT/$f.stats" ] || fail "no comm stats from the $f run ($OUT/$f.stats)"
  check "$f: comm stats lines (ranks)" "$(wc -l < "$OUT/$f.stats")" 4
done

S=$OUT/real.stats
V=$(get "$S" 0 vocab) d=$(get "$S" 0 d_model) L=$(get "$S" 0 layers) T=$(get "$S" 0 seq)
P=$(get "$S" 0 params) steps=$(get "$S" 0 steps) accum=$(get "$S" 0 accumulation)
root=$((V * d + T * d + 2 * d)) block=$((12 * d * d + 10 * d))
check "params of GPT(vocab $V, d $d, seq $T, $L blocks) vs closed form root + L * block" "$P" $((root + L * block))
shard_elems=$(((root + 1) / 2 + L * ((block + 1) / 2)))
expect=$((steps * 4 * shard_elems))
echo "expected cross-node (replicate group) bytes per rank: steps $steps * 4 B * (ceil($root/2) + $L * ceil($block/2))" \
     "= $steps * 4 * $shard_elems = $expect"

ns0=$(stat -L -c %i "/var/run/netns/$ACCEL_MN_NS0") ns1=$(stat -L -c %i "/var/run/netns/$ACCEL_MN_NS1")
sent_node=(0 0)
for r in 0 1 2 3; do
  n=$((r / 2))
  check "rank $r: world size / nodes / node / local rank / simulated" \
        "$(get "$S" $r world_size)/$(get "$S" $r num_nodes)/$(get "$S" $r node)/$(get "$S" $r local_rank)/$(get "$S" $r simulated_nodes)" \
        "4/2/$n/$((r % 2))/0"
  want_ns=$ns0
  [ $n = 1 ] && want_ns=$ns1
  check "rank $r: network namespace inode (host $n's)" "$(get "$S" $r netns)" "$want_ns"
  check "rank $r: shard group / replicate group sizes" "$(get "$S" $r shard_group)/$(get "$S" $r replicate_group)" "2/2"
  check "rank $r: cross-node bytes sent" "$(get "$S" $r replicate.sent)" "$expect"
  check "rank $r: cross-node bytes received" "$(get "$S" $r replicate.received)" "$expect"
  check "rank $r: cross-node all-reduces (one per unit per step)" \
        "$(get "$S" $r replicate.all_reduce.calls)/$(get "$S" $r replicate.calls)" "$((steps * (L + 1)))/$((steps * (L + 1)))"
  sent_node[n]=$((sent_node[n] + $(get "$S" $r replicate.sent)))
  for key in replicate.sent replicate.received replicate.calls shard.sent shard.received shard.calls gather.sent gather.received; do
    check "rank $r: $key, 2 hosts vs simulated nodes" "$(get "$S" $r $key)" "$(get "$OUT/sim.stats" $r $key)"
  done
  if [ $r -gt 0 ]; then
    check "rank $r: weights broadcast received = rank 0's sent" "$(get "$S" $r world.broadcast.received)" \
          "$(get "$S" 0 world.broadcast.sent)"
  fi
  check_ge "rank $r: world all-reduce bytes (loss reduce, 4 B per micro-step)" "$(get "$S" $r world.all_reduce.sent)" \
           $((steps * accum * 4))
done
wb=$(get "$S" 0 world.broadcast.sent)
if [ "$wb" -ge $((4 * P)) ] && [ $((wb % (4 * P))) = 0 ]; then
  echo "ok: world broadcast of rank 0's weights = $wb B = $((wb / (4 * P))) x 4 B x $P params"
else
  echo "FAIL: world broadcast from rank 0 = $wb B, expected a positive multiple of 4 B x $P params"
  errors=$((errors + 1))
fi
for r in 0 1 2 3; do
  check "simulated run, rank $r: node / simulated" "$(get "$OUT/sim.stats" $r node)/$(get "$OUT/sim.stats" $r simulated_nodes)" \
        "$((r / 2))/1"
done

check_ge "host 0 veth tx bytes (>= its ranks' cross-node sent + one copy of the weights)" "$tx0" \
         $((sent_node[0] + 4 * P))
check_ge "host 1 veth tx bytes (>= its ranks' cross-node sent)" "$tx1" "${sent_node[1]}"
awk -v a="$tx0" -v b="$tx1" -v la=$((sent_node[0] + 4 * P)) -v lb="${sent_node[1]}" \
  'BEGIN { printf "veth tx / lower bound: host 0 %.3f, host 1 %.3f (TCP/IP headers, the weights sent more than once, Open MPI runtime)\n", a / la, b / lb }'

# Loss: finite, decreasing, and the same as with simulated nodes (the same collectives over the same
# groups of two: the sums are exact, only the 4-rank loss reduce may differ in its last bit).
check "real run: loss log lines" "$(wc -l < "$OUT/real.log")" "$steps"
awk -v rtol=1e-6 '
  NR == FNR { ref[$2] = $4; next }
  { if ($4 != $4 + 0 || $4 == "nan" || $4 == "inf" || $4 == "-inf") { print "FAIL: step " $2 " loss " $4 " is not finite"; bad = 1 }
    if (!($2 in ref)) { print "FAIL: step " $2 " missing from the simulated run"; bad = 1; next }
    d = $4 - ref[$2]; if (d < 0) d = -d; r = ref[$2] < 0 ? -ref[$2] : ref[$2]
    if (d > rtol * r) { printf "FAIL: step %d loss %.9g vs simulated %.9g\n", $2, $4, ref[$2]; bad = 1 }
    if (d / r > worst) worst = d / r
    if (FNR == 1) first = $4; last = $4 }
  END { printf "loss: step 1 %.6g -> step %d %.6g; worst relative difference to simulated nodes %.2e (tolerance %s)\n",
               first, FNR, last, worst, rtol
        if (!(last < first)) { print "FAIL: the loss did not decrease"; bad = 1 }
        exit bad }' "$OUT/sim.log" "$OUT/real.log" || errors=$((errors + 1))

if [ "$errors" -gt 0 ]; then
  echo "FAILED: $errors check(s); runs in $OUT"
  exit 1
fi
echo "PASSED: HYBRID_SHARD on 2 hosts x 2 ranks; cross-node bytes per rank $expect as expected"
