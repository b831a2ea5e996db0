#!/usr/bin/env bash
# One shipped config, one example binary: trains at 2 ranks under `accel launch` and at world 1 with no
# launcher, and checks that both loss trajectories follow the reference (the DDP config at 2 ranks,
# written by the fixture test) within a relative tolerance.
#   follow_reference.sh ACCEL_CLI BINARY CONFIG REFERENCE_LOG OUT_DIR [RTOL]
# REFERENCE_LOG "world1": CONFIG is the reference's own config, whose 2-rank run IS the reference;
# its 2-rank run is compared with its single-process run (world 1, no launcher) instead.
# EXPECT_DEVICE=cuda|cpu (optional): each run's output must say it ran there (gpt_lm's first line,
# "gpt_lm: N process(es) on cuda, ..."), so that a config landing on the other device fails.
set -euo pipefail
ACCEL=$1 BIN=$2 CONFIG=$3 REF=$4 OUT=$5 RTOL=${6:-2e-4}
ARGS=(--steps 20 --seed 3)
name=$(basename "$CONFIG"); name=${name%.*}
mkdir -p "$OUT"
[ "$REF" = world1 ] || [ -f "$REF" ] || { echo "missing reference log $REF (run the fixture test first)"; exit 1; }

compare() {  # compare LOG LABEL REFERENCE
  awk -v rtol="$RTOL" -v label="$2" -v all=1 -f "$(dirname "$0")/../support/compare_losses.awk" "$3" "$1"
}

"$ACCEL" launch -n 2 "$BIN" --config_file "$CONFIG" --log_file "$OUT/$name.np2.log" "${ARGS[@]}" | tee "$OUT/$name.np2.out"
ACCEL_CONFIG_FILE="$CONFIG" "$BIN" --log_file "$OUT/$name.np1.log" "${ARGS[@]}" | tee "$OUT/$name.np1.out"
status=0
if [ -n "${EXPECT_DEVICE:-}" ]; then
  for f in "$OUT/$name.np2.out" "$OUT/$name.np1.out"; do
    grep -q " process(es) on $EXPECT_DEVICE," "$f" || { echo "FAIL: $f: the run did not say it ran on $EXPECT_DEVICE"; status=1; }
  done
fi
if [ "$REF" = world1 ]; then
  compare "$OUT/$name.np2.log" "$name at 2 ranks against $name at world 1, no launcher" "$OUT/$name.np1.log" || status=1
else
  compare "$OUT/$name.np2.log" "$name at 2 ranks" "$REF" || status=1
  compare "$OUT/$name.np1.log" "$name at world 1, no launcher" "$REF" || status=1
fi
exit $status
