#!/usr/bin/env bash
# The GPU scripts' own logic, on a machine without a GPU: scripts/gpu_check.sh's deadline, signal and
# --bench handling, and benchmarks/largest_model.sh's --start, --max-d and --deadline-s, with stand-ins
# for nvidia-smi and accel's programs (tests/scripts/fake_*.sh). A lent GPU's call that runs past its
# limit returns nothing, so these decide whether a short lease brings anything back.
#   bash tests/scripts/gpu_scripts.sh ACCEL_CLI     (the built accel: launch --dry_run, estimate-memory)
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CLI=${1:?usage: gpu_scripts.sh ACCEL_CLI}
TMP=$(mktemp -d /tmp/accel_gpu_scripts.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
FAILS=0
check() {  # check WHAT COMMAND...: the command's status is the verdict
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; FAILS=$((FAILS + 1)); fi
}
has() { grep -qE -- "$2" "$1"; }

# A GPU that nvidia-smi reports, and programs that sleep.
mkdir -p "$TMP/path" "$TMP/bin"
printf '#!/bin/sh\necho "GPU 0: stand-in (UUID: GPU-none)"\n' >"$TMP/path/nvidia-smi"
chmod +x "$TMP/path/nvidia-smi"
for p in accel accel_tests cuda_tests step_bench gpt_lm; do ln -s "$HERE/fake_program.sh" "$TMP/bin/$p"; done
gpu_check() {
  env PATH="$TMP/path:$PATH" ACCEL_BIN="$TMP/bin" \
    bash "$ROOT/scripts/gpu_check.sh" --no-build "$@"
}
no_process_left() { sleep 1; ! pgrep -f "$TMP/bin/" >/dev/null; }

# 1. GPU_CHECK_DEADLINE_S: a step that would start after it is LATE, the one running at it is stopped
# (its processes with it), and the summary and packed logs still come.
FAKE_SLEEP=3 FAKE_SLEEP_accel_tests=60 GPU_CHECK_DEADLINE_S=5 GPU_CHECK_OUT="$TMP/d" GPU_CHECK_TAR="$TMP/d.tgz" \
  gpu_check --no-bench --only '^(accel_env|cuda_comm_np1|cuda_training_np1)$' >"$TMP/d.out" 2>&1
rc=$?
check "deadline: exit status 1" [ "$rc" = 1 ]
check "deadline: the first step passed" has "$TMP/d.out" '^accel_env +PASS'
check "deadline: the step running at the deadline is STOP" has "$TMP/d.out" '^cuda_comm_np1 +STOP'
check "deadline: the next is LATE, not run" has "$TMP/d.out" '^cuda_training_np1 +LATE .*not run'
check "deadline: it never started" bash -c "! grep -q 'cuda_tests  *starting' '$TMP/d.out'"
check "deadline: the stopped step's processes are gone" no_process_left
check "deadline: the logs are packed" bash -c "tar tzf '$TMP/d.tgz' | grep -q 'accel_env.log'"

# 2. A TERM from outside (as timeout sends): the running step stopped, the summary printed, the logs
# packed. The TERM goes once the step has started (a fixed delay came before it on a loaded machine);
# the wait ends with the script's own exit, after its summary.
env PATH="$TMP/path:$PATH" ACCEL_BIN="$TMP/bin" FAKE_SLEEP=30 \
  GPU_CHECK_OUT="$TMP/s" GPU_CHECK_TAR="$TMP/s.tgz" \
  bash "$ROOT/scripts/gpu_check.sh" --no-build --no-bench --only '^accel_env$' >"$TMP/s.out" 2>&1 &
gc=$!
for _ in $(seq 300); do grep -q "starting" "$TMP/s/accel_env.log" 2>/dev/null && break; sleep 0.1; done
kill -TERM "$gc"
wait "$gc"
check "signal: the running step is STOP" has "$TMP/s.out" '^accel_env +STOP'
check "signal: the summary says so" has "$TMP/s.out" 'stopped by a signal'
check "signal: the logs are packed" test -s "$TMP/s.tgz"
check "signal: the step's processes are gone" no_process_left

# 3. --bench REGEX: of the benchmarks, only those it matches (and no test under --bench-only).
FAKE_SLEEP=0 FP8_ROUNDS=1 GPU_CHECK_OUT="$TMP/b" gpu_check --bench-only --bench '^fp8_bound_accel' >"$TMP/b.out" 2>&1
steps=$(sed -n '/^== summary/,$p' "$TMP/b.out" | awk 'NR > 1 && NF >= 2 {print $1 ":" $2}' | tr '\n' ' ')
check "--bench: exactly the matching benchmarks ran ($steps)" \
  [ "$steps" = "fp8_bound_accel_bf16_1:PASS fp8_bound_accel_fp8_1:PASS " ]

# 3b. accel against PyTorch: a round runs every pair once, so a deadline leaves whole rounds of each, and
# the tables say how many runs each median covers. (Stand-ins that print a table row after 0.5 s: a
# round of 12 runs takes 6-12 s, so 15 s hold the first whole and never all 5.)
mkdir -p "$TMP/rowbin"
for p in accel accel_tests cuda_tests gpt_lm; do ln -s "$HERE/fake_program.sh" "$TMP/rowbin/$p"; done
printf '#!/bin/sh\nsleep 0.5; echo "| X | fp32 | 1 | 10.0 |"\n' >"$TMP/rowbin/step_bench"
printf '#!/bin/sh\nsleep 0.5; echo "| torch | fp32 | 1 | 12.5 |"\n' >"$TMP/rowpy"
chmod +x "$TMP/rowbin/step_bench" "$TMP/rowpy"
env PATH="$TMP/path:$PATH" ACCEL_BIN="$TMP/rowbin" PYTHON="$TMP/rowpy" VS_ROUNDS=5 GPU_CHECK_DEADLINE_S=15 \
  GPU_CHECK_OUT="$TMP/v" bash "$ROOT/scripts/gpu_check.sh" --no-build --bench-only --only '^vs_torch_' >"$TMP/v.out" 2>&1
check "vs_torch rounds: the first round ran every pair, default to bf16" \
  bash -c "ls '$TMP/v' | grep -q '^vs_torch_bf16_FULL_SHARD_torch_1.log$'"
check "vs_torch rounds: the deadline stopped them before the fifth" bash -c "! ls '$TMP/v' | grep -q '_5.log$'"
check "vs_torch rounds: the fp32 table gives the runs of each median" \
  has "$TMP/v.out" '^\| default \| plain \| 10 \| 12\.5 \| 0\.80 \| [1-4] \|$'
check "vs_torch rounds: and the bf16 table" has "$TMP/v.out" '^\| FULL_SHARD \| FSDP2 \| 10 \| 12\.5 \| 0\.80 \| [1-4] \|$'

# 4. largest_model.sh on a "GPU" whose limits the stand-in step_bench knows: ZERO_3 to d 1280,
# optimizer offload to 2304, ZeRO-Infinity beyond --max-d.
lm() {
  env STEP_BENCH="$HERE/fake_step_bench.sh" ACCEL_CLI="$CLI" FAKE_MAX_D_INF=4096 \
    bash "$ROOT/benchmarks/largest_model.sh" --device cuda --resolution 128 --cap 4 --log "$TMP/lm.log" \
    --start "ZERO_3=1280 ZERO_3+opt=2304 ZERO_3+ckpt+opt+param=3200" "$@"
}
FAKE_SLEEP=0 lm --max-d 3328 >"$TMP/m.out" 2>"$TMP/m.err"
check "largest_model: ZERO_3's answer in 2 runs" has "$TMP/m.out" '^\| ZERO_3 \| 1280 \| 0\.398B \| 1\.00 .*\| 2 \|$'
check "largest_model: ZeRO-Offload's answer" has "$TMP/m.out" '^\| ZERO_3\+opt \| 2304 \| 1\.283B \| 3\.22 '
check "largest_model: ZeRO-Infinity stopped at --max-d, reported as >=" \
  has "$TMP/m.out" '^\| ZERO_3\+ckpt\+opt\+param \| >= 3328 \| 2\.672B \| 6\.71 .*\| 2 \|$'
check "largest_model: each size that trains is shown as it does" has "$TMP/m.err" 'ZERO_3\+opt d=2304: trains'
FAKE_SLEEP=0 lm --max-d "ZERO_3+opt=2304 ZERO_3+ckpt+opt+param=3200" >"$TMP/c.out" 2>"$TMP/c.err"
check "largest_model --max-d S=D: the strategy without one is searched" has "$TMP/c.out" '^\| ZERO_3 \| 1280 .*\| 2 \|$'
check "largest_model --max-d S=D: --start at the bound confirms it in one run" \
  has "$TMP/c.out" '^\| ZERO_3\+opt \| >= 2304 .*\| 1 \|$'
check "largest_model --max-d S=D: the same for ZeRO-Infinity" has "$TMP/c.out" '^\| ZERO_3\+ckpt\+opt\+param \| >= 3200 .*\| 1 \|$'
lm --d-model 1024 >"$TMP/d.out" 2>"$TMP/d.err"
d_rc=$?
check "largest_model: --d-model outside the CPU's --offload run is refused (exit 2), not ignored" \
  eval '[ $d_rc = 2 ] && has "$TMP/d.err" "--d-model is the one size of the CPU.s --offload DIR run"'
FAKE_SLEEP=6 lm --deadline-s 5 >"$TMP/t.out" 2>"$TMP/t.err"
check "largest_model --deadline-s: the search in progress keeps what it found" \
  has "$TMP/t.out" '^\| ZERO_3 \| >= 1280 \| 0\.398B '
check "largest_model --deadline-s: a strategy not reached says so" \
  has "$TMP/t.out" '^\| ZERO_3\+ckpt\+opt\+param \| not searched \(deadline\) '
# An offloaded run that throws (not for its size): its search stops at the first run and its row shows
# the error, instead of failing every smaller size as "out of memory?".
FAKE_SLEEP=0 FAKE_THROW_OPT=1 lm --max-d 3328 >"$TMP/x.out" 2>"$TMP/x.err"
check "largest_model: a run that throws stops its strategy's search after one run" \
  has "$TMP/x.out" "^\| ZERO_3\+opt \| a run failed, not for its size: d_model 2304: rc 134: what\(\):  Can't detach views .*\| 1 \|\$"
check "largest_model: the same for ZeRO-Infinity" \
  has "$TMP/x.out" "^\| ZERO_3\+ckpt\+opt\+param \| a run failed, not for its size: d_model 3200: .*\| 1 \|\$"
check "largest_model: a strategy that runs is still searched beside it" has "$TMP/x.out" '^\| ZERO_3 \| 1280 \| 0\.398B \| 1\.00 .*\| 2 \|$'
check "largest_model: the failure is in the log as not a size" has "$TMP/lm.log" 'ZERO_3\+opt d=2304 failed \(not its size\): rc 134'
# A rank killed at the memory limit while its peer throws is a size that did not fit: the searches go on.
FAKE_SLEEP=0 FAKE_PEER_THROWS=1 lm --max-d 3328 >"$TMP/k.out" 2>"$TMP/k.err"
check "largest_model: a peer's throw beside a kill is still too big" has "$TMP/k.out" '^\| ZERO_3\+opt \| 2304 \| 1\.283B '
check "largest_model: and no search stopped for it" bash -c "! grep -q 'a run failed' '$TMP/k.out'"

if ((FAILS)); then
  echo "$FAILS check(s) failed; outputs:"
  for f in "$TMP"/*.out "$TMP"/*.err; do echo "--- $f"; tail -30 "$f"; done
  exit 1
fi
echo "all checks passed"
