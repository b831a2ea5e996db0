#!/usr/bin/env bash
# `accel bench` when a run fails: DDP and ZeRO-2 at 1 and 2 ranks with a step_bench that fails at 2
# ranks (bench_failing_step_bench.sh). Expected: exit status 1, an error naming the run, the exit code,
# its log and what to change; the two 1-rank records kept in the JSONL and plotted.
#   bench_failing_run.sh ACCEL_CLI STEP_BENCH PYTHON SOURCE_DIR OUT_DIR
set -uo pipefail
CLI=$1 STEP=$2 PY=$3 SRC=$4 OUT=$5
rm -rf "$OUT"
out=$(BENCH_REAL_STEP_BENCH=$STEP "$CLI" bench --num_processes 1,2 --strategies DDP,ZERO_2 --layers 2 --d_model 64 \
  --heads 4 --seq 16 --vocab 256 --steps 2 --warmup 1 --python "$PY" --out "$OUT" \
  --step_bench "$SRC/tests/cli/bench_failing_step_bench.sh" 2>&1)
rc=$?
printf '%s\n' "$out"
fail() { echo "FAILED: $*"; exit 1; }
[ "$rc" = 1 ] || fail "exit status $rc, expected 1"
for pat in "run 3/4 \(DDP fp32, 2 ranks\) failed: accel launch exited with code 3" \
           "simulated failure at 2 ranks" "logs/DDP_fp32_n2\.log" "leave this run out \(--strategies, --num_processes" \
           "the 2 finished run\(s\) are kept in .*scaling\.jsonl \(plotted\)"; do
  grep -qE "$pat" <<<"$out" || fail "the output lacks /$pat/"
done
"$PY" "$SRC/tests/cli/bench_check.py" "$OUT" --ranks 1,2 --strategies DDP,ZERO_2 --min-records 2
