#!/usr/bin/env bash
# The GPT example's loss curve under mixed precision against a reference precision's curve, per
# strategy, as users run it (`accel launch`, the shipped configs, ACCEL_MIXED_PRECISION selects the precision):
#
#   lm_curves.sh ACCEL_CLI GPT_LM SOURCE_DIR OUT_DIR [options] [-- extra gpt_lm arguments]
#     --strategies "ddp zero3"   strategies to run: a name below, or NAME=CONFIG_FILE
#                                  ddp   = configs/ddp.yaml
#                                  zero1 = configs/deepspeed/zero1.json   zero3 = configs/deepspeed/zero3.json
#                                  full_shard = configs/fsdp/full_shard.yaml
#     --precisions "bf16 fp16"   the precisions checked against the reference (ACCEL_MIXED_PRECISION values)
#     --reference fp32           the precision of the reference curve (fp32 = ACCEL_MIXED_PRECISION=no);
#                                e.g. --reference bf16 --precisions fp8 --tolerance fp8=...
#     --tolerance P=RTOL         the largest relative per-step loss difference allowed for precision P
#                                (repeatable; defaults below; a precision without one is an error)
#     --min_difference RTOL      the low-precision curve must differ from the reference somewhere by more
#                                than this (default 1e-6): it really ran in another precision. (A run
#                                repeated in the same precision is bit-identical; fp16, the closest to
#                                fp32, differed by >= 2.7e-5 at every seed tried.)
#     --min_drop FRACTION        every curve's last loss must be below (1 - FRACTION) x its first (default 0.1)
#     --steps N (default 50)     --np N (default 2)
#
# Checks, for each strategy S: the reference run and each precision P's run exit 0 and log steps 1..N,
# finite; each curve's loss falls; and for each P against the reference of S:
#   max over steps |loss_P - loss_ref| / loss_ref <= tolerance(P), and > min_difference.
# A failure prints the offending step with both curves' values. Exit status: the number of failed checks.
#
# Default tolerances, against fp32, for the run ctest makes (tests/mixed_precision/lm_curves.cmake:
# 50 steps at 2 ranks, seed 0, OMP_NUM_THREADS=1), about 3x the measured max relative per-step
# difference. Measured with `ctest -R mp_lm_curves -V` on a 2-core AMD EPYC VM with AVX-512 (bf16
# instructions); in brackets after it, the README table's AVX2 VM:
#   bf16 3e-3  [measured 9.65e-4 under DDP and ZeRO-3 alike (step 42); AVX2: 6.7e-4]. Tight enough to
#              tell fp32 masters from bf16 ones: the same run with DeepSpeed's
#              bf16.bf16_master_weights_and_grads true (configs/deepspeed/zero3.json with that key,
#              ACCEL_MIXED_PRECISION=bf16, `accel launch -n 2 gpt_lm --config_file ... --steps 50`, against
#              the fp32 curve) is 7.5e-3 off under ZeRO-3 and 8.1e-3 under stage 0 (AVX2: 8.3e-3),
#              2.5x over this tolerance. bf16 keeps 8 significant bits (unit
#              roundoff 2^-9 = 2e-3) and the trajectories drift apart as they train: other seeds drift
#              further (seed 3: 4.7e-3, `lm_curves.sh ... --strategies ddp -- --seed 3`), so this
#              tolerance holds for seed 0 only; give --tolerance bf16=... for others.
#   fp16 3e-4  [measured 8.5e-5 under DDP and ZeRO-3 (step 45); 3.8e-5 at seed 3; AVX2: 7.2e-5]. fp16 keeps 11 bits
#              (2^-12 = 2.4e-4, 8x finer than bf16) and the loss scaler skips no step here. Skipped
#              steps show: with initial_scale_power 24 (a few overflowing steps at the start) the
#              curve is 1e-1 off.
# (The fp32 loss falls 3.22 -> 2.52 over the 50 steps at seed 0.)
set -uo pipefail
if [ $# -lt 4 ]; then sed -n '2,26p' "$0"; exit 2; fi
ACCEL=$1 GPT=$2 SRC=$3 OUT=$4
shift 4
STRATEGIES="ddp zero3" PRECISIONS="bf16 fp16" REFERENCE=fp32 STEPS=50 NP=2 MIN_DIFF=1e-6 MIN_DROP=0.1
declare -A TOL=([bf16]=3e-3 [fp16]=3e-4)
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --strategies) STRATEGIES=$2; shift 2 ;;
    --precisions) PRECISIONS=$2; shift 2 ;;
    --reference) REFERENCE=$2; shift 2 ;;
    --tolerance) TOL[${2%%=*}]=${2#*=}; shift 2 ;;
    --min_difference) MIN_DIFF=$2; shift 2 ;;
    --min_drop) MIN_DROP=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --np) NP=$2; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "lm_curves.sh: unknown argument '$1' (see the header of $0)"; exit 2 ;;
  esac
done

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok:   $*"; }

config_of() {  # config_of NAME -> the config file
  case "$1" in
    *=*) echo "${1#*=}" ;;
    ddp) echo "$SRC/configs/ddp.yaml" ;;
    zero1|zero2|zero3) echo "$SRC/configs/deepspeed/$1.json" ;;
    full_shard|shard_grad_op|no_shard|hybrid_shard) echo "$SRC/configs/fsdp/$1.yaml" ;;
    *) echo "" ;;
  esac
}
env_value() { [ "$1" = fp32 ] && echo no || echo "$1"; }  # the ACCEL_MIXED_PRECISION value

for p in $PRECISIONS; do
  [ "$(env_value "$p")" != "$(env_value "$REFERENCE")" ] || { echo "lm_curves.sh: precision '$p' is the reference itself"; exit 2; }
  [ -n "${TOL[$p]:-}" ] || { echo "lm_curves.sh: no tolerance for precision '$p' (give --tolerance $p=RTOL)"; exit 2; }
done
mkdir -p "$OUT" || exit 2

# run NAME CONFIG PRECISION: the example at NP ranks; its log in $OUT/NAME.PRECISION.log
run() {
  local log=$OUT/$1.$3.log out=$OUT/$1.$3.out
  rm -f "$log"
  ACCEL_MIXED_PRECISION=$(env_value "$3") "$ACCEL" launch -n "$NP" "$GPT" --config_file "$2" \
    --steps "$STEPS" --log_file "$log" "${EXTRA[@]}" > "$out" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    fail "$1 $3: gpt_lm at $NP ranks exited $rc; from its output ($out):"
    { grep -m 3 -i "error" "$out" || tail -5 "$out"; } | sed 's/^/      /'
    return 1
  fi
  # steps 1..STEPS in order, each loss a finite number
  if ! awk -v n="$STEPS" '$1 != "step" || $2 != NR || $3 != "loss" || $4 !~ /^-?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$/ { bad = 1; print "      line " NR ": " $0 }
                          END { if (NR != n) { print "      " NR " lines, want " n; bad = 1 } exit bad }' "$log"; then
    fail "$1 $3: $log is not $STEPS finite steps"
    return 1
  fi
  # the loss fell: last < (1 - MIN_DROP) x first
  local msg
  if msg=$(awk -v drop="$MIN_DROP" 'NR == 1 { first = $4 } { last = $4 }
             END { printf "loss %.4f -> %.4f over %d steps", first, last, NR; exit !(last < (1 - drop) * first) }' "$log"); then
    pass "$1 $3: $msg"
  else
    fail "$1 $3: the loss did not fall by $MIN_DROP of its first value: $msg"
  fi
  return 0
}

# compare LOG REF RTOL: the largest relative per-step difference within RTOL and above MIN_DIFF. (Also,
# for the reader, not the check: the largest relative difference of the two curves' means over
# consecutive windows of 10 steps, which one batch's swing does not dominate.)
compare() {
  awk -v rtol="$3" -v floor="$MIN_DIFF" -v rname="$(basename "$2")" -v gname="$(basename "$1")" '
    NR == FNR { ref[$2] = $4; rtext[$2] = $4; next }
    { d = $4 - ref[$2]; if (d < 0) d = -d; r = ref[$2] < 0 ? -ref[$2] : ref[$2]; rel = d / r
      if ($4 != rtext[$2]) differ++
      if (rel > rtol && ++over <= 10) { printf "      step %d: %s %.9g vs %s %.9g: relative difference %.2e > %s\n", $2, gname, $4, rname, ref[$2], rel, rtol }
      if (rel > worst) { worst = rel; at = $2 }
      w = int(seen / 10); seen++; msum[w] += $4; rsum[w] += ref[$2] }
    END {  # after the first 10 offending steps, their count; last line: the largest difference, its step, how many steps differ at all, and the largest window difference
      if (over > 10) printf "      ... %d steps over the tolerance in all\n", over
      for (k in msum) { d = msum[k] - rsum[k]; if (d < 0) d = -d; r = rsum[k] < 0 ? -rsum[k] : rsum[k]
        if (r > 0 && d / r > wmax) wmax = d / r }
      printf "%.2e %d %d %.2e\n", worst, at, differ, wmax
      exit over ? 1 : (worst > floor ? 0 : 2)
    }' "$2" "$1"
}

for s in $STRATEGIES; do
  name=${s%%=*}
  cfg=$(config_of "$s")
  [ -n "$cfg" ] && [ -f "$cfg" ] || { fail "strategy '$s': no config file '${cfg:-?}'"; continue; }
  echo "== $name ($cfg), $NP ranks, $STEPS steps; reference $REFERENCE"
  run "$name" "$cfg" "$REFERENCE" || continue
  ref=$OUT/$name.$REFERENCE.log
  for p in $PRECISIONS; do
    run "$name" "$cfg" "$p" || continue
    log=$OUT/$name.$p.log
    out=$(compare "$log" "$ref" "${TOL[$p]}")
    st=$?
    read -r worst at differ windows <<< "$(tail -1 <<< "$out")"
    detail=$(head -n -1 <<< "$out")
    both=$(awk -v k="$at" '$2 == k { printf "%s", $4 }' "$log")" vs "$(awk -v k="$at" '$2 == k { printf "%s", $4 }' "$ref")
    summary="$name $p vs $REFERENCE: max relative per-step difference $worst at step $at ($p $both $REFERENCE), tolerance ${TOL[$p]}, $differ of $STEPS steps differ; 10-step means within $windows"
    case $st in
      0) pass "$summary" ;;
      1) fail "$summary"; echo "$detail" ;;
      2) fail "$name $p vs $REFERENCE: the curves differ by at most $worst relative ($differ of $STEPS steps differ), not above $MIN_DIFF: the $p run did not run in $p" ;;
    esac
  done
done
[ $failures -eq 0 ] && echo "lm_curves: all checks passed" || echo "lm_curves: $failures check(s) failed"
exit $failures
