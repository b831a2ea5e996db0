#!/usr/bin/env bash
# Usage: fault_test.sh MPIRUN PROBE MODE NP — runs the fault probe under mpirun and asserts the job
# ends non-zero within the bound (the probe's timeout plus start-up slack), never hangs.
set -u
mpirun=$1 probe=$2 mode=$3 np=$4
limit=40
start=$(date +%s)
out=$(timeout 120 "$mpirun" --oversubscribe -np "$np" "$probe" "$mode" 2>&1)
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "$out" | tail -n 20
echo "fault_test: mode=$mode np=$np exit=$rc elapsed=${elapsed}s (bound ${limit}s)"
fail=0
[ "$rc" -ne 0 ] || { echo "FAIL: the job exited 0 although a rank failed"; fail=1; }
[ "$rc" -ne 124 ] || { echo "FAIL: the job hung (killed by timeout 120)"; fail=1; }
[ "$elapsed" -le "$limit" ] || { echo "FAIL: took ${elapsed}s > ${limit}s"; fail=1; }
if [ "$mode" = timeout ]; then
  echo "$out" | grep -q "caught TimeoutError: all_reduce(float32\[4\], sum) on rank 0 of $np did not complete within 2" ||
    { echo "FAIL: no TimeoutError naming the collective and rank 0"; fail=1; }
fi
echo "$out" | grep -q "returned without rank 1" && { echo "FAIL: a collective completed without rank 1"; fail=1; }
[ $fail -eq 0 ] && echo "fault_test: PASS"
exit $fail
