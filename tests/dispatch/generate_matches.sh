#!/usr/bin/env bash
# examples/generate end to end: a random tiny Llama checkpoint written by --make_random_checkpoint,
# generated from fully in memory and with its layers paged from disk under a small max_memory: the
# same tokens, and the dispatched run reports layers on disk and tokens/s.
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
echo "PASS: the same tokens with layers on disk"
