#!/usr/bin/env bash
# step_bench's MFU against its closed form: at 1 and 2 ranks, `step_bench --json --peak_tflops 2`
# must report model_flops = (6 * params + 12 * layers * seq * d_model) * batch * seq * ranks (PaLM's
# count, benchmarks/mfu.h), devices = ranks (the CPU: one per rank), and
# mfu = model_flops / (step_ms / 1000) / (2e12 * ranks); without --peak_tflops on the CPU, mfu is null.
#   mfu_check.sh ACCEL STEP_BENCH PYTHON
set -uo pipefail
ACCEL=$1 BENCH=$2 PY=$3
shape=(--layers 2 --d-model 64 --heads 4 --vocab 256 --seq 16 --batch 2 --steps 2 --warmup 1 --json)
failures=0
for np in 1 2; do
  strategy=DDP; [ $np = 1 ] && strategy=plain
  for peak in 2 none; do
    args=("${shape[@]}"); [ $peak = none ] || args+=(--peak_tflops "$peak")
    out=$("$ACCEL" launch -n $np "$BENCH" --strategy $strategy "${args[@]}" 2>&1) || { echo "FAIL: step_bench exited $?: $out"; failures=$((failures + 1)); continue; }
    line=$(grep '^{' <<<"$out" | tail -1)
    if "$PY" - "$line" "$peak" <<'PY'; then echo "ok:   np $np, peak $peak"; else failures=$((failures + 1)); fi
import json, sys
d, peak = json.loads(sys.argv[1]), sys.argv[2]
want = (6 * d["params"] + 12 * d["layers"] * d["seq"] * d["d_model"]) * d["batch"] * d["seq"] * d["ranks"]
bad = []
if abs(d["model_flops"] - want) > 1e-6 * want: bad.append(f"model_flops {d['model_flops']} != {want}")
if d["devices"] != d["ranks"]: bad.append(f"devices {d['devices']} != ranks {d['ranks']}")
if peak == "none":
    if d["mfu"] is not None or d["peak_tflops"] is not None: bad.append(f"mfu {d['mfu']} without a peak on the CPU")
else:
    mfu = want / (d["step_ms"] / 1e3) / (float(peak) * 1e12 * d["ranks"])
    if d["mfu"] is None or abs(d["mfu"] - mfu) > 1e-3 * mfu + 1e-5: bad.append(f"mfu {d['mfu']} != {mfu:.5f}")
print(f"ranks {d['ranks']}: model_flops {d['model_flops']:.4e} (closed form {want:.4e}), step {d['step_ms']} ms, mfu {d['mfu']}")
for b in bad: print("FAIL:", b)
sys.exit(1 if bad else 0)
PY
  done
done
[ $failures = 0 ] && echo "PASSED" || { echo "FAILED ($failures)"; exit 1; }
