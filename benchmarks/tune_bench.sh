#!/usr/bin/env bash
# benchmarks/tune_bench.sh — `accel tune`'s staged search against the exhaustive run of the same grid
# (issue 37's benchmark): the GPT example at 2 ranks, every candidate of the grid measured once
# (--exhaustive), then the staged search with --time_limit (both re-measure their fastest few before
# choosing, as every `accel tune` does); prints both tables, then measures the two winners side by side
# from the configs they wrote (ROUNDS alternating runs each, default 3, through `accel launch` as a user
# would run them) and prints the staged winner's median throughput over the exhaustive winner's and the
# time ratio.
#   bash benchmarks/tune_bench.sh OUT_DIR [GPT_LM ARGS...]
# Small shape (the default GPT, about 18M parameters here, ~15 min):
#   bash benchmarks/tune_bench.sh /tmp/tune_small --d_model 384 --layers 10 --heads 6 --seq 64 --batch 16
# Large shape (510M parameters, 48 candidates, ~48 min on 2 cores):
#   TUNE_ARGS="--bucket_mib 5,25 --warmup 1 --steps 3" WARMUP=1 STEPS=3 bash benchmarks/tune_bench.sh /tmp/tune_large \
#     --d_model 1536 --layers 18 --heads 12 --seq 32 --batch 8
# TUNE_ARGS adds flags to both runs (e.g. TUNE_ARGS="--budget 10GB --bucket_mib 5,25"); WARMUP and STEPS
# (default 2 and 5) are the side-by-side runs' warm-up and measured steps; SIDE_ONLY=1 repeats only the
# side-by-side measurement on an OUT_DIR of an earlier run.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:?usage: tune_bench.sh OUT_DIR [GPT_LM ARGS...]}
shift
CLI=${ACCEL_CLI:-$ROOT/build/bin/accel}
GPT=${GPT_LM:-$ROOT/build/bin/gpt_lm}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
read -r -a EXTRA <<<"${TUNE_ARGS:-}"
lscpu | grep -m1 'Model name' | sed 's/  */ /g'
# SIDE_ONLY=1: the two tune runs are in OUT already; only the side-by-side measurement again.
[ -n "${SIDE_ONLY:-}" ] || { rm -rf "$OUT" && mkdir -p "$OUT"; }
for mode in exhaustive staged; do
  [ -z "${SIDE_ONLY:-}" ] || break
  flags=(-n 2 --work_dir "$OUT/$mode" --out "$OUT/$mode.yaml" "${EXTRA[@]}")
  if [ "$mode" = exhaustive ]; then flags+=(--exhaustive --time_limit 600); else flags+=(--time_limit "${TIME_LIMIT:-20}"); fi
  t0=$(date +%s)
  "$CLI" tune "${flags[@]}" "$GPT" --steps 100000 "$@" >"$OUT/$mode.out" 2>"$OUT/$mode.err"
  echo "$mode: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/walls"
  sed -n '/^| rank |/,/^$/p' "$OUT/$mode.out"
done
# The two winners side by side, alternating, from the files `accel tune` wrote.
winner() { sed -n 's/^# Winner: \(.*\): [0-9.]* samples\/s.*/\1/p' "$OUT/$1.yaml"; }
batch() { sed -n 's/^# Run the program with \(.*\) (micro batch.*/\1/p' "$OUT/$1.yaml"; }
args=()  # the program's arguments without --batch, which each winner sets
skip=0
for w in "$@"; do
  if [ "$skip" = 1 ]; then skip=0; elif [ "$w" = --batch ]; then skip=1; elif [ "${w#--batch=}" = "$w" ]; then args+=("$w"); fi
done
if [ "$(winner exhaustive)" = "$(winner staged)" ]; then
  echo "side by side: both chose $(winner staged)" | tee "$OUT/side"
else
  for r in $(seq "${ROUNDS:-3}"); do
    for mode in exhaustive staged; do
      read -r -a bw <<<"$(batch "$mode")"
      ACCEL_TUNE="warmup=${WARMUP:-2},steps=${STEPS:-5},report=$OUT/side_$mode.jsonl" \
        "$CLI" launch --config_file "$OUT/$mode.yaml" "$GPT" --steps 100000 "${args[@]}" "${bw[@]}" >"$OUT/side_$mode.log" 2>&1
      echo "side by side, round $r, $mode winner ($(winner "$mode")): $(tail -1 "$OUT/side_$mode.jsonl")"
    done
  done | tee "$OUT/side"
fi
python3 - "$OUT" <<'PYEOF'
import re, sys
out = sys.argv[1]
def table(mode):
    """candidate -> throughput as 1 / step ms (the table's step ms has more digits than its samples/s)"""
    rows = {}
    for line in open(f"{out}/{mode}.out"):
        m = re.match(r"^\| (\d*) \| (.+?) \| ([\d.]*) \| ([\d.]*) \|", line)
        if m and m.group(1) and m.group(4):
            rows[m.group(2)] = (float(m.group(3)), 1.0 / float(m.group(4)))
    return rows
ex, st = table("exhaustive"), table("staged")
walls = dict(l.split(": ") for l in open(f"{out}/walls").read().split("\n") if l)
best_label = max(ex, key=lambda k: ex[k][1])
win_label = max(st, key=lambda k: st[k][1])
print(f"exhaustive: {len(ex)} candidates that fit, best {best_label} at {ex[best_label][0]} samples/s, {walls['exhaustive']}")
print(f"staged: {len(st)} candidates that fit, winner {win_label} at {st[win_label][0]} samples/s, {walls['staged']}")
if win_label in ex:
    print(f"the winner in the exhaustive run: {ex[win_label][0]} samples/s = "
          f"{ex[win_label][1] / ex[best_label][1]:.3f} of the exhaustive best (by step time)")
print(f"staged winner's own figure / exhaustive best: {st[win_label][1] / ex[best_label][1]:.3f}")
import json, statistics
side = open(f"{out}/side").read().splitlines()
if side and "both chose" in side[0]:
    print(f"side by side: the same candidate: staged / exhaustive winner = 1.000")
else:
    med = {}
    for mode in ("exhaustive", "staged"):
        xs = [json.loads(l.split("): ", 1)[1])["samples_per_s"] for l in side if f", {mode} winner" in l]
        med[mode] = statistics.median(xs)
        print(f"side by side: {mode} winner {len(xs)} runs, samples/s {', '.join(f'{x:.2f}' for x in xs)}, median {med[mode]:.2f}")
    print(f"side by side: staged / exhaustive winner = {med['staged'] / med['exhaustive']:.3f} (medians)")
print(f"time: staged / exhaustive = {int(walls['staged'].split()[0]) / int(walls['exhaustive'].split()[0]):.3f}")
PYEOF
