#!/usr/bin/env bash
# `accel bench` end to end on this machine: a tiny GPT under DDP, ZeRO-2 and ZeRO-3 at 1, 2 and 4 ranks
# (4 ranks oversubscribe 2 cores), then tests/cli/bench_check.py checks the JSONL against closed forms
# and the PNGs.
#   bench_sweep.sh ACCEL_CLI PYTHON SOURCE_DIR OUT_DIR
set -euo pipefail
CLI=$1 PY=$2 SRC=$3 OUT=$4
rm -rf "$OUT"
"$CLI" bench --num_processes 1,2,4 --strategies ddp,zero2,zero3 --layers 2 --d_model 64 --heads 4 --seq 16 \
  --vocab 256 --steps 2 --warmup 1 --python "$PY" --out "$OUT"
"$PY" "$SRC/tests/cli/bench_check.py" "$OUT" --ranks 1,2,4 --strategies DDP,ZERO_2,ZERO_3 --nodes 1,1,1
