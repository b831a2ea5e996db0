#!/usr/bin/env bash
# Every command the GPU scripts would run, with the arguments they would give it, checked on this
# machine: scripts/gpu_check.sh (every step, tests and benchmarks) and both calls of scripts/gpu_lease.sh,
# run from a bundle of this build's programs with a stand-in nvidia-smi and ACCEL_CHECK_ARGS set
# (src/base/check_args.h). Each program then checks its command line and stops before any work: a
# test binary's --gtest_filter must match a test, step_bench's and gpt_lm's options must parse (and
# gpt_lm's config file load), torch_anchor.py's too. A lent GPU's minutes are few; an option renamed or
# repeated, or a filter that matches nothing, is found here instead.
#   bash tests/scripts/gpu_args.sh BIN_DIR     (the build's bin/: accel, accel_tests, cuda_tests, step_bench, gpt_lm)
# Exit 77 (a ctest SKIP) where the scripts cannot run here: not root (--bundle copies into /), or no
# Python with torch.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=$(cd "${1:?usage: gpu_args.sh BIN_DIR}" && pwd)
[ "$(id -u)" = 0 ] || { echo "SKIP: gpu_check.sh --bundle copies into / and runs as root only"; exit 77; }
VENV_PY=${ACCEL_CACHE:-$HOME/.cache/accel}/venv-torch-2.11.0/bin/python
PY=${PYTHON:-$( [ -x "$VENV_PY" ] && echo "$VENV_PY" || echo python3 )}
"$PY" -c 'import torch' 2>/dev/null || { echo "SKIP: $PY cannot import torch"; exit 77; }
TMP=$(mktemp -d /tmp/accel_gpu_args.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

# A GPU that nvidia-smi reports, and a bundle (scripts/gpu_bundle.sh's layout) of this build's programs.
mkdir -p "$TMP/path" "$TMP/bundle/bin" "$TMP/bundle/lib" "$TMP/bundle/root" "$TMP/args"
printf '#!/bin/sh\necho "GPU 0: stand-in (UUID: GPU-none)"\n' >"$TMP/path/nvidia-smi"
chmod +x "$TMP/path/nvidia-smi"
for p in accel accel-rank accel_tests cuda_tests step_bench gpt_lm; do
  [ -x "$BIN/$p" ] || { echo "FAIL: $BIN/$p is not built"; exit 1; }
  ln -s "$BIN/$p" "$TMP/bundle/bin/$p"
done
echo "a stand-in bundle of $BIN (tests/scripts/gpu_args.sh)" >"$TMP/bundle/MANIFEST"

run() {  # run NAME COMMAND...: the command as a lent GPU would run it, its output in $TMP/NAME.out
  local name=$1; shift
  local t0=$(date +%s)
  env PATH="$TMP/path:$PATH" PYTHON="$PY" ACCEL_CHECK_ARGS="$TMP/args" "$@" >"$TMP/$name.out" 2>&1
  local rc=$?
  echo "$name: ran in $(( $(date +%s) - t0 )) s, exit $rc (not the verdict: its programs stopped early)"
}
# (One round of the runs the scripts repeat: each round's commands are the same.)
run gpu_check env VS_ROUNDS=1 FP8_ROUNDS=1 GPU_CHECK_OUT="$TMP/check" bash "$ROOT/scripts/gpu_check.sh" --bundle "$TMP/bundle"
LEASE=(env OUT="$TMP/lease" LEASE_BUNDLE="$TMP/bundle" LEASE_WORK="$TMP" LEASE_VS_ROUNDS=1)
run lease_1 "${LEASE[@]}" bash "$ROOT/scripts/gpu_lease.sh" 1 600
run lease_2 "${LEASE[@]}" bash "$ROOT/scripts/gpu_lease.sh" 2 600

FAILS=0
started=0
declare -A seen
for s in "$TMP"/args/*.start; do
  [ -e "$s" ] || continue
  started=$((started + 1))
  prog=$(basename "$(head -1 "$s")")
  seen[$prog]=1
  if [ ! -e "${s%.start}.ok" ]; then
    echo "FAIL: these arguments were not accepted: $(tr '\n' ' ' <"$s")"
    FAILS=$((FAILS + 1))
  fi
done
echo "$started commands started, $FAILS not accepted"
# Each kind of program the scripts run took part (a script that stopped early would leave some out).
for prog in accel accel_tests cuda_tests step_bench gpt_lm torch_anchor.py; do
  [ -n "${seen[$prog]:-}" ] || { echo "FAIL: no command of $prog was checked"; FAILS=$((FAILS + 1)); }
done
if ((FAILS)); then
  for f in "$TMP"/*.out; do echo "--- $f (last lines)"; tail -15 "$f"; done
  exit 1
fi
echo "all arguments accepted"
