#!/usr/bin/env bash
# --checkpointing_steps under fp16, whose first steps overflow and are skipped (a loss scale of 2^40,
# halved at each overflow): a skipped step leaves acc.step() where it was, so it saves nothing. One
# checkpoint per step taken, none before the first, and a resume from the newest says the steps taken.
# Usage: fp16_skip_checkpoints.sh ACCEL_CLI GPT_LM OUT_DIR
set -u
ACCEL=$1 GPT=$2 OUT=$3
rm -rf "$OUT" && mkdir -p "$OUT" && cd "$OUT" || exit 1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
cat > fp16.json <<'EOF'
{"train_micro_batch_size_per_gpu": "auto",
 "fp16": {"enabled": true, "initial_scale_power": 40, "hysteresis": 1, "loss_scale_window": 1000},
 "zero_optimization": {"stage": 2}}
EOF
steps=40
model=(--layers 1 --d_model 32 --heads 2 --seq 16 --seed 2)
"$ACCEL" launch -n 2 "$GPT" --config_file fp16.json --steps $steps "${model[@]}" --project_dir p \
  --checkpointing_steps 1 > run.out 2>&1 || { tail -5 run.out; fail "the run exited non-zero"; }
skipped=$(sed -nE 's/.* ([0-9]+) of '$steps' steps skipped \(overflow\).*/\1/p' run.out)
saved=$(find p/checkpoints -mindepth 1 -maxdepth 1 -type d -name 'checkpoint_*' 2>/dev/null | wc -l)
echo "$skipped of $steps steps skipped; $saved checkpoints"
if [ -z "$skipped" ] || [ "$skipped" -eq 0 ] || [ "$skipped" -ge $steps ]; then
  fail "want some steps skipped and some taken (the scaler's line: '$(grep 'steps skipped' run.out)')"
elif [ "$saved" -ne $((steps - skipped)) ]; then
  fail "$saved checkpoints for $((steps - skipped)) steps taken (one per step taken)"
else
  echo "ok: one checkpoint per step taken, none for the $skipped skipped"
fi
"$ACCEL" launch -n 2 "$GPT" --config_file fp16.json --steps $steps "${model[@]}" --project_dir p \
  --resume_from_checkpoint latest > resumed.out 2>&1 || { tail -5 resumed.out; fail "the resumed run exited non-zero"; }
if [ -n "$skipped" ] && grep -q "at step $((steps - skipped))\b" resumed.out; then
  echo "ok: the newest checkpoint holds step $((steps - skipped))"
else
  fail "the resume did not say step $((steps - skipped)): $(grep -m1 resumed resumed.out)"
fi
[ $failures -eq 0 ] && echo "PASSED" || echo "FAILED ($failures)"
[ $failures -eq 0 ]
