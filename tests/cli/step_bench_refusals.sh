#!/usr/bin/env bash
# step_bench refuses, before any step and naming the way out, the options its run would otherwise
# ignore or cannot honour (one rank, no launcher; each case exits 2 with its message):
#   step_bench_refusals.sh STEP_BENCH
set -uo pipefail
SB=$1
failures=0
refused() {  # refused MESSAGE ARGS...
  local msg=$1; shift
  out=$("$SB" --steps 1 --warmup 0 --layers 1 --d-model 16 --heads 2 --seq 8 --vocab 64 --batch 1 "$@" 2>&1)
  local rc=$?
  if [ $rc -eq 2 ] && grep -q -- "$msg" <<<"$out"; then
    echo "ok:   $* -> $msg"
  else
    echo "FAIL: $* exited $rc, expected 2 and '$msg':"; sed 's/^/    /' <<<"$out" | tail -5
    failures=$((failures + 1))
  fi
}
refused "--json prints one run's line" --strategy DDP,ZERO_1 --json
refused "--json prints one run's line" --strategy DDP --precision fp32,bf16 --json
refused "--offload-optimizer and --offload-param need an accel strategy" --strategy plain --offload-optimizer /tmp/none
refused "--offload-optimizer and --offload-param need an accel strategy" --strategy plain --offload-param /tmp/none
refused "--step-in-backward needs an accel strategy" --strategy plain --step-in-backward
# (beside an accel strategy the option is that strategy's: accepted, as benchmarks/run_step_bench.sh passes it)
out=$("$SB" --steps 1 --warmup 0 --layers 1 --d-model 16 --heads 2 --seq 8 --vocab 64 --batch 1 \
      --strategy plain,ZERO_2 --step-in-backward 2>&1)
if [ $? -eq 0 ]; then echo "ok:   --strategy plain,ZERO_2 --step-in-backward runs"
else echo "FAIL: --strategy plain,ZERO_2 --step-in-backward:"; tail -3 <<<"$out"; failures=$((failures + 1)); fi
refused "--sync-each-batch needs an accel strategy" --strategy plain --accumulation 2 --sync-each-batch on
refused "--checkpoint needs an accel strategy" --strategy plain --checkpoint
refused "--strategy plain runs in fp32 only" --strategy plain --precision bf16
# (a value out of range is CLI11's parse error: its own exit status)
out=$("$SB" --strategy DDP --warmup -1 2>&1)
if [ $? -ne 0 ] && grep -q -- "--warmup: Value -1 not in range" <<<"$out"; then echo "ok:   --warmup -1 refused"
else echo "FAIL: --warmup -1 not refused:"; tail -3 <<<"$out"; failures=$((failures + 1)); fi
# (and what they refuse runs: one JSON line for one run)
out=$("$SB" --steps 1 --warmup 0 --layers 1 --d-model 16 --heads 2 --seq 8 --vocab 64 --batch 1 --strategy DDP --json 2>&1)
if grep -q '^{.*"strategy"' <<<"$out"; then echo "ok:   one strategy with --json prints its JSON line"
else echo "FAIL: no JSON line:"; tail -3 <<<"$out"; failures=$((failures + 1)); fi
echo "$failures failure(s)"
[ "$failures" -eq 0 ]
