#!/usr/bin/env bash
# `accel bench` across two hosts: network namespaces joined by a veth pair (run under
# multinode_netns.sh, which exports ACCEL_MN_*), a hostfile of 2 hosts x 2 slots, a tiny GPT under DDP and
# ZeRO-3 at 1, 2 and 4 ranks: 1 and 2 ranks on host 0, 4 ranks on both hosts (Open MPI over TCP on the
# veth; multinode_rsh_agent.sh replaces ssh). bench_check.py then checks the records against closed
# forms, that the 4-rank runs saw 2 nodes (the topology MPI reports, not simulated) and the PNGs.
#
#   multinode_netns.sh bench_multinode.sh ACCEL_CLI PYTHON SOURCE_DIR OUT_DIR
set -euo pipefail
CLI=$1 PY=$2 SRC=$3 OUT=$4
HERE=$(cd "$(dirname "$0")" && pwd)
: "${ACCEL_MN_NS0:?run under multinode_netns.sh}"
unset ACCEL_RANKS_PER_NODE  # real nodes: the topology comes from Open MPI
rm -rf "$OUT"
mkdir -p "$OUT"
source "$HERE/multinode_mpi_env.sh"
mn_hostfile "$OUT/hostfile"
mpi_env=("${mn_mpi_env[@]}")
cmd=("$CLI" bench --hostfile "$OUT/hostfile" --num_processes 1,2,4 --strategies DDP,ZERO_3 --layers 2 --d_model 64
     --heads 4 --seq 16 --vocab 256 --steps 2 --warmup 1 --python "$PY" --out "$OUT/report")
echo "multinode_enter.sh $ACCEL_MN_NS0 env ${mpi_env[*]} ${cmd[*]}"
t0=$(date +%s)
"$HERE/multinode_enter.sh" "$ACCEL_MN_NS0" env "${mpi_env[@]}" timeout "${ACCEL_MN_RUN_TIMEOUT:-240}" "${cmd[@]}" ||
  { echo "FAIL: accel bench across 2 hosts exited with $? (logs: $OUT/report/logs)"; exit 1; }
echo "(accel bench on 2 hosts: $(($(date +%s) - t0)) s)"
"$PY" "$SRC/tests/cli/bench_check.py" "$OUT/report" --ranks 1,2,4 --strategies DDP,ZERO_3 --nodes 1,1,2
