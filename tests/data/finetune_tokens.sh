#!/usr/bin/env bash
# Text to training, as a user runs it: examples/prepare_tokens.py turns the repository's docs/*.md into
# token files (a byte-level BPE trained on them; nothing downloaded), then llama_finetune --data trains
# on them at 2 ranks under DDP and under ZeRO-3 (a checkpoint at step 6, mid-epoch), and once more
# resumed from that checkpoint. Checks: the token files and meta.json are there; ZeRO-3's losses follow
# DDP's within 2e-4 relative; the resumed run's steps 7-12 are the uninterrupted run's exactly (it
# continues at the same window); the held-out loss at the end is below the one before training.
#   finetune_tokens.sh ACCEL_CLI LLAMA_FINETUNE PYTHON SOURCE_DIR OUT_DIR
set -euo pipefail
ACCEL=$1 BIN=$2 PY=$3 SRC=$4 OUT=$5
COMPARE="$(dirname "$0")/../support/compare_losses.awk"
rm -rf "$OUT" && mkdir -p "$OUT"

"$PY" "$SRC/examples/prepare_tokens.py" --out "$OUT/tokens" --vocab_size 384 "$SRC"/docs/*.md
for f in train.bin val.bin tokenizer.json meta.json; do
  [ -s "$OUT/tokens/$f" ] || { echo "FAIL: prepare_tokens.py wrote no $f"; exit 1; }
done

ARGS=(--data "$OUT/tokens" --steps 12 --seq 64 --batch 8 --seed 3 --eval_every 6)
"$ACCEL" launch -n 2 "$BIN" --config_file "$SRC/configs/ddp.yaml" "${ARGS[@]}" --log_file "$OUT/ddp.log" | tee "$OUT/ddp.out"
"$ACCEL" launch -n 2 "$BIN" --config_file "$SRC/configs/deepspeed/zero3.yaml" "${ARGS[@]}" --log_file "$OUT/zero3.log" \
    --project_dir "$OUT/project" --checkpointing_steps 6 | tee "$OUT/zero3.out"
"$ACCEL" launch -n 2 "$BIN" --config_file "$SRC/configs/deepspeed/zero3.yaml" "${ARGS[@]}" --log_file "$OUT/resumed.log" \
    --resume_from_checkpoint "$OUT/project/checkpoints/checkpoint_0" | tee "$OUT/resumed.out"

status=0
awk -v rtol=2e-4 -v label="ZeRO-3 against DDP, 2 ranks, token files" -v all=1 -f "$COMPARE" "$OUT/ddp.log" "$OUT/zero3.log" || status=1
[ "$(head -1 "$OUT/resumed.log" | awk '{print $2}')" = 7 ] || { echo "FAIL: the resumed run did not start at step 7"; status=1; }
awk -v rtol=0 -v label="resumed at step 6 against the run that went on" -f "$COMPARE" "$OUT/zero3.log" "$OUT/resumed.log" || status=1
first=$(grep -o 'step 0 eval loss [0-9.]*' "$OUT/zero3.out" | awk '{print $5}')
last=$(grep -o 'step 12 eval loss [0-9.]*' "$OUT/zero3.out" | awk '{print $5}')
if [ -z "$first" ] || [ -z "$last" ] || ! awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }'; then
  echo "FAIL: held-out loss '$first' before training, '$last' after"; status=1
else
  echo "held-out loss $first before training, $last after 12 steps"
fi
[ $status = 0 ] && echo "PASS"
exit $status
