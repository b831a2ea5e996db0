#!/usr/bin/env bash
# benchmarks/tune_bench.sh — `accel tune`'s staged search against the exhaustive run of the same grid
# (issue 37's benchmark): the GPT example at 2 ranks, every candidate of the grid measured once
# (--exhaustive), then the staged search with --time_limit; prints both tables and a summary line: the
# staged winner, its throughput in the exhaustive run against the exhaustive best, and the wall times.
#   bash benchmarks/tune_bench.sh OUT_DIR [GPT_LM ARGS...]
# Small shape (the default GPT, about 18M parameters here, ~15 min):
#   bash benchmarks/tune_bench.sh /tmp/tune_small --d_model 384 --layers 10 --heads 6 --seq 64 --batch 16
# TUNE_ARGS adds flags to both runs (e.g. TUNE_ARGS="--budget 10GB --bucket_mib 5,25").
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:?usage: tune_bench.sh OUT_DIR [GPT_LM ARGS...]}
shift
CLI=${ACCEL_CLI:-$ROOT/build/bin/accel}
GPT=${GPT_LM:-$ROOT/build/bin/gpt_lm}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
read -r -a EXTRA <<<"${TUNE_ARGS:-}"
rm -rf "$OUT" && mkdir -p "$OUT"
lscpu | grep -m1 'Model name' | sed 's/  */ /g'
for mode in exhaustive staged; do
  flags=(-n 2 --work_dir "$OUT/$mode" --out "$OUT/$mode.yaml" "${EXTRA[@]}")
  if [ "$mode" = exhaustive ]; then flags+=(--exhaustive --time_limit 600); else flags+=(--time_limit "${TIME_LIMIT:-20}"); fi
  t0=$(date +%s)
  "$CLI" tune "${flags[@]}" "$GPT" --steps 100000 "$@" >"$OUT/$mode.out" 2>"$OUT/$mode.err"
  echo "$mode: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/walls"
  sed -n '/^| rank |/,/^$/p' "$OUT/$mode.out"
done
python3 - "$OUT" <<'PYEOF'
import re, sys
out = sys.argv[1]
def table(mode):
    rows = {}
    for line in open(f"{out}/{mode}.out"):
        m = re.match(r"^\| (\d*) \| (.+?) \| ([\d.]*) \|", line)
        if m and m.group(3):
            rows[m.group(2)] = float(m.group(3))
    return rows
ex, st = table("exhaustive"), table("staged")
walls = dict(l.split(": ") for l in open(f"{out}/walls").read().split("\n") if l)
best_label = max(ex, key=ex.get)
win_label = max(st, key=st.get)
print(f"exhaustive: {len(ex)} runs that fit, best {best_label} at {ex[best_label]:.1f} samples/s, {walls['exhaustive']}")
print(f"staged: {len(st)} runs that fit, winner {win_label} at {st[win_label]:.1f} samples/s, {walls['staged']}")
if win_label in ex:
    print(f"the winner in the exhaustive run: {ex[win_label]:.1f} samples/s = {ex[win_label] / ex[best_label]:.3f} of the exhaustive best")
print(f"staged winner's own figure / exhaustive best: {st[win_label] / ex[best_label]:.3f}")
print(f"time: staged / exhaustive = {int(walls['staged'].split()[0]) / int(walls['exhaustive'].split()[0]):.3f}")
PYEOF
