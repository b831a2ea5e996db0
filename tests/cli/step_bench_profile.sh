#!/usr/bin/env bash
# step_bench --profile (benchmarks/step_profile.h) at 2 ranks under ZeRO-3 and DDP, a GPT of L blocks:
# rank 0 prints a summary per run and writes one Chrome trace per run. Checks against what the engine
# must do in a step, counted independently of the profiler's arithmetic: under ZeRO-3 the engine's
# pre-forward hook runs once per sharded unit (the L blocks; the root unit stays gathered) and the
# sharded optimizer steps once, so accel::pre_forward shows L calls a step and accel::optimizer_step 1;
# the traces are JSON that Python reads, holding those scopes as events (3 profiled steps: 3 L and 3).
#   step_bench_profile.sh ACCEL_CLI STEP_BENCH PYTHON OUT_DIR
set -euo pipefail
CLI=$1 SB=$2 PY=$3 OUT=$4
L=3
rm -rf "$OUT" && mkdir -p "$OUT"
"$CLI" launch -n 2 "$SB" --strategy ZERO_3,DDP --steps 2 --warmup 1 --layers $L --d-model 64 --heads 4 --seq 16 \
  --vocab 128 --profile="$OUT/trace.json" 2>&1 | tee "$OUT/out"
fail() { echo "FAIL: $*"; exit 1; }
grep -qE '^profile ZERO_3 fp32: 3 profiled step\(s\), [0-9.]+ ms a step; trace .*/trace.ZERO_3_fp32.json$' "$OUT/out" ||
  fail "no ZeRO-3 summary line"
grep -qE "^profile ZERO_3 fp32 +[0-9.]+ ms a step +$L\.0 calls a step  accel::pre_forward$" "$OUT/out" ||
  fail "accel::pre_forward is not $L calls a step under ZeRO-3"
grep -qE '^profile ZERO_3 fp32 +[0-9.]+ ms a step +1\.0 calls a step  accel::optimizer_step$' "$OUT/out" ||
  fail "accel::optimizer_step is not once a step"
grep -qE '^profile DDP fp32 top host ops' "$OUT/out" || fail "no DDP summary"
"$PY" - "$OUT" "$L" <<'PYEOF'
import json, sys
out, layers = sys.argv[1], int(sys.argv[2])
for run, want in (("ZERO_3_fp32", {"accel::pre_forward": 3 * layers, "accel::optimizer_step": 3}),
                  ("DDP_fp32", {"accel::optimizer_step": 3})):
    events = json.load(open(f"{out}/trace.{run}.json"))["traceEvents"]
    for name, n in want.items():
        got = sum(1 for e in events if e.get("name") == name and e.get("ph") == "X")
        assert got == n, f"{run}: {got} {name} events in the trace, expected {n}"
    print(f"ok: trace.{run}.json: {len(events)} events, {want}")
PYEOF
echo "PASS: step_bench --profile"
