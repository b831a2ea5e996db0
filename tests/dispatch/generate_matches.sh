#!/usr/bin/env bash
# examples/generate end to end: a random tiny Llama checkpoint written by --make_random_checkpoint,
# generated from fully in memory and with its layers paged from disk under a small max_memory: the
# same tokens, and the dispatched run reports layers on disk and tokens/s. Then the same for a Qwen2
# (q/k/v biases, sliding layers) and a Mistral (a window of 6) checkpoint, made from their config.json:
# generate takes the family its directory's model_type names.
# usage: generate_matches.sh <generate binary> <work dir>
set -euo pipefail
gen=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
"$gen" --make_random_checkpoint "$work/ckpt" --preset tiny --max_shard_size 300KB --seed 5
"$gen" --model "$work/ckpt" --device_map cpu --max_new_tokens 12 --seed 1 | tee "$work/full.txt"
"$gen" --model "$work/ckpt" --device_map auto --max_memory cpu=250KB --offload_folder "$work/offload" \
  --max_new_tokens 12 --seed 1 --drop_page_cache | tee "$work/disk.txt"
full=$(grep '^tokens: ' "$work/full.txt") disk=$(grep '^tokens: ' "$work/disk.txt")
[[ -n "$full" && "$full" == "$disk" ]] || { echo "FAIL: tokens differ: '$full' vs '$disk'"; exit 1; }
grep -Eq '[1-9][0-9]* layers on disk' "$work/disk.txt" || { echo "FAIL: no layer went to disk"; exit 1; }
grep -Eq '[0-9.]+ tokens/s; peak RSS [0-9.]+ MiB' "$work/disk.txt" || { echo "FAIL: no tokens/s or peak RSS"; exit 1; }
for family in qwen2 mistral; do
  if [ $family = qwen2 ]; then
    extra='"use_sliding_window": true, "sliding_window": 6, "max_window_layers": 2'
  else
    extra='"sliding_window": 6'
  fi
  cat > "$work/$family.json" <<EOF
{"model_type": "$family", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, $extra}
EOF
  "$gen" --make_random_checkpoint "$work/$family" --config "$work/$family.json" --max_shard_size 300KB --seed 5
  "$gen" --model "$work/$family" --device_map cpu --max_new_tokens 12 --seed 1 | tee "$work/$family.full.txt"
  "$gen" --model "$work/$family" --device_map auto --max_memory cpu=250KB --offload_folder "$work/offload_$family" \
    --max_new_tokens 12 --seed 1 | tee "$work/$family.disk.txt"
  full=$(grep '^tokens: ' "$work/$family.full.txt") disk=$(grep '^tokens: ' "$work/$family.disk.txt")
  [[ -n "$full" && "$full" == "$disk" ]] || { echo "FAIL: $family: tokens differ: '$full' vs '$disk'"; exit 1; }
  grep -q "\"model_type\": \"$family\"" "$work/$family/config.json" || { echo "FAIL: $family: config.json"; exit 1; }
done
echo "PASS: the same tokens with layers on disk (Llama, Qwen2, Mistral)"
