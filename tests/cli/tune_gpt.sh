#!/usr/bin/env bash
# `accel tune` on the GPT example at 2 ranks: a small grid (DDP and ZeRO-3, micro batches 1 and 2,
# checkpointing off and on, two bucket sizes) searched, the ranked table printed, the winner written as
# an Accelerate YAML that `accel config explain` reads and that trains the example; then the same as a
# DeepSpeed JSON.
#   tune_gpt.sh ACCEL_CLI GPT_LM OUT_DIR
set -euo pipefail
CLI=$1 GPT=$2 OUT=$3
rm -rf "$OUT" && mkdir -p "$OUT"
MODEL=(--layers 2 --d_model 64 --heads 4 --seq 32)
"$CLI" tune -n 2 --time_limit 5 --strategies ddp,zero3 --micro_batches 1,2 --bucket_mib 1,25 --warmup 1 --steps 3 \
  --work_dir "$OUT/work" --out "$OUT/tuned.yaml" "$GPT" "${MODEL[@]}" --steps 1000 --batch 4 | tee "$OUT/tune.out"
grep -E '^\| rank \| candidate \| samples/s' "$OUT/tune.out"
grep -E '^\| 1 \| (DDP|ZERO_3) mb [12] x acc [12], bucket (1|25) MiB' "$OUT/tune.out"
grep -E '^# Chosen by accel tune' "$OUT/tuned.yaml"
"$CLI" config explain "$OUT/tuned.yaml" | tee "$OUT/explain.out"
mb=$(sed -n 's/^# Run the program with --batch \([0-9]*\) .*/\1/p' "$OUT/tuned.yaml")
[ -n "$mb" ] || { echo "FAILED: the YAML does not say the batch"; exit 1; }
"$CLI" launch --config_file "$OUT/tuned.yaml" "$GPT" "${MODEL[@]}" --steps 3 --batch "$mb" --log_file "$OUT/train.log"
[ "$(wc -l < "$OUT/train.log")" -ge 3 ] || { echo "FAILED: the tuned config did not train 3 steps"; cat "$OUT/train.log"; exit 1; }
"$CLI" tune -n 2 --time_limit 5 --strategies zero3 --micro_batches 2 --checkpointing on --warmup 1 --steps 2 \
  --dialect deepspeed --work_dir "$OUT/work_ds" --out "$OUT/not_yet/tuned.json" "$GPT" "${MODEL[@]}" --batch 4
grep -q '"_comment"' "$OUT/not_yet/tuned.json"  # (--out in a directory that did not exist)
"$CLI" config explain "$OUT/not_yet/tuned.json" | grep "ZeRO stage 3"
echo "PASS: tuned, written, explained and trained"
