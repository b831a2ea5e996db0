#!/usr/bin/env bash
# `accel tune` survives a candidate that runs out of memory: tune_program asks for more memory than
# any machine has when its micro batch is over 2 rows per rank. The search records "does not fit: out
# of memory" for micro batch 4, never runs a larger micro batch of that kind after it, goes on, and
# writes a winner at micro batch 1 or 2 that loads.
#   tune_oom.sh ACCEL_CLI TUNE_PROGRAM OUT_DIR
set -euo pipefail
CLI=$1 PROG=$2 OUT=$3
rm -rf "$OUT" && mkdir -p "$OUT"
"$CLI" tune -n 2 --time_limit 5 --strategies ddp,zero2 --micro_batches 1,2,4,8 --checkpointing off --warmup 1 \
  --steps 3 --work_dir "$OUT/work" --out "$OUT/tuned.yaml" "$PROG" --batch 16 --oom_above 2 2>&1 | tee "$OUT/tune.out"
grep -E '^\|  \| (DDP|ZERO_2) mb 4 x acc 2, bucket 25 MiB .*\| does not fit: out of memory: exit code' "$OUT/tune.out"
# The progress lines, in the order the runs ran: after "[k] S mb M ... out of memory" no run of S with a
# micro batch of M or more.
awk '/^\[[0-9]+\] / { s = $2; mb = $4 + 0
       if (s in oom && mb >= oom[s]) { print "FAILED: " $0 " ran after micro batch " oom[s] " of " s " did not fit"; bad = 1 }
       if ($0 ~ /out of memory/ && (!(s in oom) || mb < oom[s])) oom[s] = mb }
     END { exit bad }' "$OUT/tune.out"
grep -E '^\| 1 \| (DDP|ZERO_2) mb [12] x acc (8|4), ' "$OUT/tune.out"
grep -q "can't allocate memory" "$OUT"/work/run*.log
grep -E '^# Winner: (DDP|ZERO_2) mb [12] x acc' "$OUT/tuned.yaml"
"$CLI" config explain "$OUT/tuned.yaml" >/dev/null
echo "PASS: the out-of-memory candidate was survived"
