#!/usr/bin/env bash
# `accel tune` across two hosts (network namespaces joined by a veth pair; run under
# multinode_netns.sh, which exports ACCEL_MN_*): `accel tune --hostfile` on host 0 with 2 hosts x 2 ranks
# of the GPT example, ZeRO-3 and HYBRID_SHARD. HYBRID_SHARD is in the grid only because the job spans
# two machines; both candidates must run, each on 2 nodes (the topology MPI reports, in each run's
# report), and the winner must be written as a YAML for 2 machines that `accel config explain` reads.
#   multinode_netns.sh tune_multinode.sh ACCEL_CLI GPT_LM OUT_DIR
set -euo pipefail
CLI=$1 GPT=$2 OUT=$3
HERE=$(cd "$(dirname "$0")" && pwd)
: "${ACCEL_MN_NS0:?run under multinode_netns.sh}"
unset ACCEL_RANKS_PER_NODE  # real nodes: the topology comes from Open MPI
rm -rf "$OUT" && mkdir -p "$OUT"
source "$HERE/multinode_mpi_env.sh"
mn_hostfile "$OUT/hostfile"
mpi_env=("${mn_mpi_env[@]}")
cmd=("$CLI" tune --hostfile "$OUT/hostfile" -n 4 --num_machines 2 --strategies zero3,hybrid_shard --micro_batches 1
     --checkpointing off --warmup 1 --steps 2 --confirm 0 --time_limit 5 --work_dir "$OUT/work" --out "$OUT/tuned.yaml"
     "$GPT" --layers 2 --d_model 64 --heads 4 --seq 32 --batch 8)
echo "multinode_enter.sh $ACCEL_MN_NS0 env ${mpi_env[*]} ${cmd[*]}"
"$HERE/multinode_enter.sh" "$ACCEL_MN_NS0" env "${mpi_env[@]}" timeout "${ACCEL_MN_RUN_TIMEOUT:-240}" "${cmd[@]}" \
  2>&1 | tee "$OUT/tune.out"
fail() { echo "FAIL: $*"; exit 1; }
for s in ZERO_3 HYBRID_SHARD; do
  grep -qE "^\| [12] \| $s mb 1 x acc 2, .*\| ok \|$" "$OUT/tune.out" || fail "no ok row for $s in the table"
done
n=0
for report in "$OUT"/work/run*.jsonl; do
  grep -q '"status": "ok".*"ranks": 4, "nodes": 2,' "$report" || fail "$report did not run 4 ranks on 2 nodes: $(cat "$report")"
  n=$((n + 1))
done
[ "$n" = 2 ] || fail "$n measured runs, expected 2 (ZeRO-3 and HYBRID_SHARD)"
grep -q '^num_machines: 2$' "$OUT/tuned.yaml" || fail "the winner's YAML is not for 2 machines"
"$CLI" config explain "$OUT/tuned.yaml" > "$OUT/explain.out" || fail "config explain refused the winner"
echo "PASS: ZeRO-3 and HYBRID_SHARD tuned across 2 hosts; winner: $(sed -n 's/^# Winner: //p' "$OUT/tuned.yaml")"
