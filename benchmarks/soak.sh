#!/usr/bin/env bash
# A long run that survives its failures (issue 35): the GPT example under ZeRO-3 at --ranks ranks for
# --steps optimizer steps, a checkpoint every --every steps (keeping --total_limit), started by
#   accel launch -n RANKS --max_restarts KILLS --auto_resume gpt_lm ...
# while this script SIGKILLs one rank, chosen at random, at KILLS random steps. Prints a markdown table:
#   - each restart: the step the rank was killed at, the checkpoint step the job resumed from, the
#     steps lost (trained again) and the seconds from the kill to the first step after it;
#   - per rank: RSS and PSS (/proc/PID/smaps_rollup: node-shared pages split among the ranks) at step
#     --rss_at (in the first start) and at the end (the last sample before the job ended, in the last
#     start), and the growth between them;
#   - after the job: the job's processes left, /dev/shm objects left that were not there before, the
#     checkpoints kept against --total_limit and their size on disk;
#   - the metrics JSONL: every step exactly once.
# Exits 1 when a check fails (the job did not finish, RSS grew more than --rss_growth_pct, anything
# left behind, more checkpoints than the limit, a step missing or doubled).
#
#   bash benchmarks/soak.sh [--ranks 4] [--steps 2000] [--every 100] [--kills 3] [--total_limit 2]
#                           [--rss_at 200] [--rss_growth_pct 5] [--seed 1] [--build build] [--out DIR]
#                           [-- GPT_LM ARGS...]   (more arguments for the example, e.g. --d_model 64)
# Run it alone on the machine: the ranks are oversubscribed on a 2-core machine, and RSS is sampled
# every 0.2 s.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/.." && pwd)
RANKS=4 STEPS=2000 EVERY=100 KILLS=3 LIMIT=2 RSS_AT=200 GROWTH=5 SEED=1 BUILD=$SRC/build OUT=""
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --ranks) RANKS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --every) EVERY=$2; shift 2 ;;
    --kills) KILLS=$2; shift 2 ;;
    --total_limit) LIMIT=$2; shift 2 ;;
    --rss_at) RSS_AT=$2; shift 2 ;;
    --rss_growth_pct) GROWTH=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --build) BUILD=$(cd "$2" && pwd); shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "soak.sh: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done
ACCEL=$BUILD/bin/accel GPT=$BUILD/bin/gpt_lm
for b in "$ACCEL" "$GPT"; do [ -x "$b" ] || { echo "soak.sh: $b is not built (bash scripts/setup.sh)" >&2; exit 2; }; done
if [ "$KILLS" -ge 1 ] && [ $((STEPS - RSS_AT - EVERY)) -le $((KILLS * 2 * EVERY)) ]; then
  echo "soak.sh: --steps $STEPS leaves too little room for $KILLS kills between step $RSS_AT and the end" >&2; exit 2
fi
[ -n "$OUT" ] || OUT=$(mktemp -d "${TMPDIR:-/tmp}/accel-soak-XXXXXX")
mkdir -p "$OUT" && cd "$OUT" || exit 2
rm -rf p loss.log job.out samples
tag="soak-$$"  # in the project dir's name: this job's ranks are the gpt_lm processes naming it
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
shm_before=$(ls /dev/shm | sort)

# Kill steps: KILLS random steps, each in its own stretch of the run after RSS_AT (so a kill never
# lands before the job reached the previous one's resume point again), in order.
RANDOM=$SEED  # (the kill steps and victims below follow --seed too, as gpt_lm's data does)
kill_at=()
if [ "$KILLS" -ge 1 ]; then
  span=$(((STEPS - RSS_AT - EVERY) / KILLS))
  for k in $(seq 0 $((KILLS - 1))); do
    kill_at+=($((RSS_AT + EVERY / 2 + k * span + RANDOM % (span - EVERY))))
  done
fi
echo "soak: $RANKS ranks, ZeRO-3, $STEPS steps, checkpoint every $EVERY (total_limit $LIMIT), kills at steps ${kill_at[*]}"
echo "soak: output in $OUT"

t_start=$(date +%s)
setsid "$ACCEL" launch -n "$RANKS" --max_restarts "$KILLS" --auto_resume "$GPT" \
  --config_file "$SRC/configs/deepspeed/zero3.yaml" --seed "$SEED" --steps "$STEPS" \
  --checkpointing_steps "$EVERY" --total_limit "$LIMIT" --project_dir "$OUT/p-$tag" --log_with jsonl \
  --log_file loss.log "${extra[@]}" > job.out 2>&1 &
job=$!

last_step() { tail -1 loss.log 2> /dev/null | awk 'END { print $2 + 0 }'; }
ranks_now() {  # "RANK PID" for this job's ranks
  for p in $(pgrep -x gpt_lm); do
    tr '\0' ' ' 2> /dev/null < /proc/"$p"/cmdline | grep -q -- "p-$tag" || continue
    r=$(tr '\0' '\n' 2> /dev/null < /proc/"$p"/environ | sed -n 's/^RANK=//p')
    [ -n "$r" ] && echo "$r $p"
  done
}
mem_of() {  # RSS and PSS of PID in MiB: "rss pss"
  local rss pss
  rss=$(awk '/^VmRSS:/ { print int($2 / 1024) }' /proc/"$1"/status 2> /dev/null)
  pss=$(awk '/^Pss:/ { print int($2 / 1024) }' /proc/"$1"/smaps_rollup 2> /dev/null)
  echo "${rss:-0} ${pss:-0}"
}
declare -A rss_first pss_first rss_last pss_last
k=0
declare -a killed_step killed_rank killed_at_s
while kill -0 $job 2> /dev/null; do
  s=$(last_step)
  sample=$(ranks_now)
  if [ -n "$sample" ]; then
    while read -r r p; do
      read -r rss pss <<< "$(mem_of "$p")"
      [ "$rss" -gt 0 ] || continue
      if [ "$s" -ge "$RSS_AT" ] && [ -z "${rss_first[$r]:-}" ] && [ "$k" = 0 ]; then rss_first[$r]=$rss; pss_first[$r]=$pss; fi
      rss_last[$r]=$rss; pss_last[$r]=$pss
    done <<< "$sample"
  fi
  if [ "$k" -lt "$KILLS" ] && [ "$s" -ge "${kill_at[$k]}" ] && [ -n "$sample" ]; then
    n=$(wc -l <<< "$sample")
    pick=$((RANDOM % n + 1))  # (in this shell: a $(...) would reseed RANDOM)
    read -r vr vp <<< "$(sort -n <<< "$sample" | sed -n "${pick}p")"
    kill -KILL "$vp" 2> /dev/null
    killed_at_s[$k]=$(date +%s.%N)
    # The step it died at: the last one logged. The others cannot finish a step without it, and the
    # job takes longer than this to start again (and rewrite the log).
    sleep 0.5
    s=$(last_step)
    killed_step[$k]=$s killed_rank[$k]=$vr
    echo "soak: kill $((k + 1)): SIGKILL to rank $vr (pid $vp) at step $s"
    k=$((k + 1))
    # The next samples (and kills) wait until the job is back and training past this step.
    for _ in $(seq 1500); do
      grep -q "restart $k of $KILLS" job.out && [ "$(last_step)" -gt "$s" ] && break
      kill -0 $job 2> /dev/null || break
      sleep 0.2
    done
    back_s=$(date +%s.%N)
    killed_back[$((k - 1))]=$(echo "$back_s - ${killed_at_s[$((k - 1))]}" | bc)
  fi
  sleep 0.2
done
wait $job
rc=$?
t_total=$(($(date +%s) - t_start))
sleep 1  # (the launcher reaps; /dev/shm objects go with the last process)

left_procs=$(pgrep -f -- "p-$tag" | wc -l)
shm_new=$(comm -13 <(echo "$shm_before") <(ls /dev/shm | sort) | grep -c . || true)
ckpts=$(ls -d "p-$tag"/checkpoints/checkpoint_* 2> /dev/null | grep -vc partial || true)
ckpt_mib=$(du -sm "p-$tag/checkpoints" 2> /dev/null | awk '{print $1}')
mapfile -t resumed < <(sed -n 's/.*accel: resumed from .*checkpoint_[0-9]* at step \([0-9]*\) (restart \([0-9]*\)).*/\2 \1/p' job.out)

errors=0
bad() { echo "FAIL: $*"; errors=$((errors + 1)); }
echo
echo "## soak: $RANKS ranks, ZeRO-3, $STEPS steps, checkpoint every $EVERY, $KILLS ranks killed (exit $rc, ${t_total} s)"
echo
echo "| restart | rank killed | at step | resumed from step | steps lost | s from the kill until past that step again |"
echo "|---:|---:|---:|---:|---:|---:|"
for i in $(seq 0 $((k - 1))); do
  from=""
  for line in "${resumed[@]}"; do set -- $line; [ "$1" = $((i + 1)) ] && from=$2; done
  lost=$([ -n "$from" ] && echo $((killed_step[i] - from)) || echo "?")
  printf '| %d | %d | %d | %s | %s | %.1f |\n' $((i + 1)) "${killed_rank[$i]}" "${killed_step[$i]}" "${from:-none}" "$lost" \
    "${killed_back[$i]:-0}"
  [ -n "$from" ] || bad "restart $((i + 1)) did not resume from a checkpoint"
done
echo
echo "| rank | RSS MiB at step $RSS_AT | RSS MiB at the end | growth | PSS MiB at step $RSS_AT | PSS MiB at the end |"
echo "|---:|---:|---:|---:|---:|---:|"
for r in $(seq 0 $((RANKS - 1))); do
  a=${rss_first[$r]:-0} b=${rss_last[$r]:-0}
  g=$(awk -v a="$a" -v b="$b" 'BEGIN { if (a > 0) printf "%+.1f%%", 100 * (b - a) / a; else print "?" }')
  printf '| %d | %d | %d | %s | %d | %d |\n' "$r" "$a" "$b" "$g" "${pss_first[$r]:-0}" "${pss_last[$r]:-0}"
  awk -v a="$a" -v b="$b" -v lim="$GROWTH" 'BEGIN { exit !(a > 0 && 100 * (b - a) / a <= lim) }' ||
    bad "rank $r: RSS $a -> $b MiB (more than $GROWTH% growth, or not sampled)"
done
echo
jsonl="p-$tag/gpt_lm/metrics.jsonl"
once=$(python3 - "$jsonl" "$STEPS" << 'PY'
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if l.strip()]
print("yes" if steps == list(range(1, int(sys.argv[2]) + 1)) else f"no ({len(steps)} rows)")
PY
)
echo "| after the job | value |"
echo "|---|---:|"
echo "| job's processes left | $left_procs |"
echo "| /dev/shm objects left | $shm_new |"
echo "| checkpoints kept (total_limit $LIMIT) | $ckpts |"
echo "| checkpoint directory MiB | ${ckpt_mib:-0} |"
echo "| metrics JSONL: every step once | $once |"
echo "| loss log lines | $(wc -l < loss.log) |"
[ "$rc" = 0 ] || bad "the job exited $rc"
[ "$left_procs" = 0 ] || bad "$left_procs of the job's processes left"
[ "$shm_new" = 0 ] || bad "$shm_new /dev/shm objects left: $(comm -13 <(echo "$shm_before") <(ls /dev/shm | sort) | tr '\n' ' ')"
[ "$ckpts" -le "$LIMIT" ] || bad "$ckpts checkpoints kept, total_limit $LIMIT"
[ "$once" = yes ] || bad "the metrics JSONL does not hold every step once: $once"
[ "$k" = "$KILLS" ] || bad "only $k of $KILLS kills happened"
if [ "$errors" = 0 ]; then
  rm -rf "p-$tag"
  echo
  echo "soak: PASSED"
else
  echo "soak: FAILED ($errors); the run is in $OUT"
  exit 1
fi
