#!/usr/bin/env bash
# accel under the sanitizers: builds the library and the comm/sharding test binaries with
# ThreadSanitizer (build-tsan/) and with AddressSanitizer + UBSan (build-asan/), then runs every comm,
# sharding and activation checkpointing test at 2-4 ranks under mpirun (ctest). Fails on a failing
# test or on any sanitizer report from any rank. libtorch and Open MPI are not instrumented; the
# runtime options and the suppressions that this needs are explained in scripts/sanitizers/README.md.
#
#   scripts/sanitize.sh                  both sanitizers, thread first
#   scripts/sanitize.sh thread|address   one of them
# Environment:
#   ACCEL_SANITIZE_TESTS  ctest regex of the tests to run (default: comm, sharding and activation
#                         checkpointing tests at 2-4 ranks)
#   ACCEL_CACHE           where scripts/setup.sh put the torch venv (default ~/.cache/accel)
#   JOBS                  build parallelism (default 2)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SAN_DIR=$ROOT/scripts/sanitizers
# The venv scripts/setup.sh made for its pinned torch.
VENV=${ACCEL_CACHE:-$HOME/.cache/accel}/venv-torch-$(sed -n 's/^TORCH_VERSION=//p' "$ROOT/scripts/setup.sh")
JOBS=${JOBS:-2}
# Test names are <prefix>_np<N> (tests/support/AccelTests.cmake): every comm_* and sharding_* test at
# 2, 3 or 4 ranks, whatever tests a later comm transport adds (the *_CUDA ones end in _CUDA: left out),
# and activation_checkpoint_*, whose recomputation re-gathers through the engine's unit hooks.
TESTS=${ACCEL_SANITIZE_TESTS:-'^(comm|sharding|activation_checkpoint)(_[a-z0-9_]+)?_np[234]$'}
# What a sanitizer report starts with (TSan, ASan, LSan, UBSan).
REPORT_RE='WARNING: ThreadSanitizer|ERROR: (Address|Leak)Sanitizer|runtime error: '

say() { printf '\n== %s\n' "$*"; }
die() { echo "sanitize.sh: $*" >&2; exit 1; }

sanitizers=("$@")
[ ${#sanitizers[@]} -gt 0 ] || sanitizers=(thread address)
for s in "${sanitizers[@]}"; do
  case $s in thread|address) ;; *) die "unknown sanitizer '$s' (thread or address)" ;; esac
done
[ -x "$VENV/bin/python" ] || die "no torch venv at $VENV: run scripts/setup.sh --no-run first"
TORCH_PREFIX=$("$VENV/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# set_options PASS LOGS: the runtime options of one pass (each option's reason: scripts/sanitizers/
# README.md). TSan and ASan write their reports to files under LOGS (log_path, one per process), so
# a rank's report is seen even where a test expects that rank to fail (the fault tests).
set_options() {
  local logs=$2
  unset TSAN_OPTIONS ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
  case $1 in
    thread)
      export TSAN_OPTIONS="ignore_noninstrumented_modules=1 second_deadlock_stack=1
        suppressions=$SAN_DIR/tsan.supp log_path=$logs/tsan" ;;
    address|leaks)
      local leaks="detect_leaks=0"
      [ "$1" = leaks ] && leaks="detect_leaks=1 fast_unwind_on_malloc=0"
      export ASAN_OPTIONS="$leaks detect_stack_use_after_return=1 check_initialization_order=1
        strict_init_order=1 log_path=$logs/asan"
      export LSAN_OPTIONS="suppressions=$SAN_DIR/lsan.supp print_suppressions=0"
      export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1 suppressions=$SAN_DIR/ubsan.supp" ;;
  esac
}

# The executables the selected tests run, by their CMake target names (read from ctest's own
# description of the tests, so no list of test files or sources lives here). Assumes a test binary's
# file name is its target's name, as for every test executable today.
test_targets() {  # test_targets BUILD REGEX
  ctest --test-dir "$1" -R "$2" --show-only=json-v1 | "$VENV/bin/python" -c '
import json, os, sys
build = os.path.realpath(sys.argv[1]) + "/bin/"
names = set()
for t in json.load(sys.stdin).get("tests", []):
    for arg in t.get("command", []):
        if os.path.realpath(arg).startswith(build) and os.path.basename(arg) not in ("accel", "accel-rank"):
            names.add(os.path.basename(arg))  # (the launcher is built first, under its target names)
print(" ".join(sorted(names)))' "$1"
}

# canary BUILD PASS MODE: the deliberate bug MODE must be reported under PASS's options.
canary() {
  local logs=$1/sanitizer-logs/canary out
  rm -rf "$logs" && mkdir -p "$logs"
  set_options "$2" "$logs"
  out=$("$1/bin/accel_sanitizer_canary" "$3" 2>&1; cat "$logs"/* 2>/dev/null)
  grep -qE "$REPORT_RE" <<<"$out" || die "$2: the canary's '$3' bug was not reported: the options hide reports"
  echo "canary $3 ($2 options): reported"
}

# run_tests BUILD PASS REGEX: ctest under PASS's options; fails on a failed test or any report.
run_tests() {
  local build=$1 pass=$2 regex=$3 logs=$1/sanitizer-logs/$2 rc=0 found
  rm -rf "$logs" && mkdir -p "$logs"
  set_options "$pass" "$logs"
  say "$pass: ctest -R '$regex'"
  # Every test's full output goes to one log: UBSan writes its reports to stderr (GCC's libubsan
  # ignores log_path beside ASan), and a test's output is the only place they appear.
  ctest --test-dir "$build" -R "$regex" -V >"$logs/ctest.log" 2>&1 || rc=$?
  grep -E '^ *[0-9]+/[0-9]+ Test|tests passed|^ +[0-9]+ - ' "$logs/ctest.log" || true
  found=$(find "$logs" -type f -size +0c -name '[at]san.*' | sort)
  if [ -n "$found" ]; then
    for f in $found; do echo "---- $f"; cat "$f"; done
    echo "$pass: $(wc -w <<<"$found") process(es) wrote sanitizer reports (above)"
    rc=1
  fi
  if grep -qE "$REPORT_RE" "$logs/ctest.log"; then
    grep -nE -A40 "$REPORT_RE" "$logs/ctest.log" | head -300
    echo "$pass: sanitizer reports in the tests' output (above)"
    rc=1
  fi
  [ $rc -eq 0 ] || echo "$pass: FAIL; the tests' full output: $logs/ctest.log"
  return $rc
}

run_one() {  # run_one SANITIZER
  local san=$1 build t0=$SECONDS rc=0
  case $san in thread) build=$ROOT/build-tsan ;; address) build=$ROOT/build-asan ;; esac

  say "$san: configure $build"
  mkdir -p "$build"
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  # NCCL off: its backend cannot run without a GPU and would only cost build time. Examples and
  # benchmarks off: no comm or sharding test runs them.
  cmake -S "$ROOT" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DACCEL_SANITIZE="$san" \
    -DACCEL_WITH_NCCL=OFF -DACCEL_BUILD_EXAMPLES=OFF -DACCEL_BUILD_BENCHMARKS=OFF \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DACCEL_PYTHON="$VENV/bin/python" >"$build/configure.log" 2>&1 ||
    { cat "$build/configure.log"; die "$san: configure failed"; }

  # Multi-rank tests start through `accel launch` (accel_add_mpi_test): the launcher must exist before
  # ctest can describe those tests' commands.
  cmake --build "$build" -j "$JOBS" --target accel_cli accel_rank
  local targets
  targets=$(test_targets "$build" "$TESTS")
  [ -n "$targets" ] || die "$san: no test matches '$TESTS'"
  say "$san: build $targets accel_sanitizer_canary"
  # shellcheck disable=SC2086
  cmake --build "$build" -j "$JOBS" --target $targets accel_sanitizer_canary

  if [ "$san" = thread ]; then
    canary "$build" thread race
    run_tests "$build" thread "$TESTS" || rc=1
  else
    # Two passes. Memory errors and UB at every world size, with ASan's fast unwinder. Leaks at 2
    # ranks only: suppressing Open MPI's own needs whole allocation stacks through its uninstrumented
    # libraries (fast_unwind_on_malloc=0), which makes every malloc about 15x slower.
    canary "$build" address overflow
    canary "$build" address shift
    run_tests "$build" address "$TESTS" || rc=1
    canary "$build" leaks leak
    local leak_tests
    leak_tests=$(ctest --test-dir "$build" -R "$TESTS" -N | sed -nE 's/^ *Test +#[0-9]+: (.*_np2)$/\1/p' | paste -sd'|')
    [ -n "$leak_tests" ] && { run_tests "$build" leaks "^($leak_tests)\$" || rc=1; }
  fi
  echo "$san: $([ $rc -eq 0 ] && echo PASS || echo FAIL) in $((SECONDS - t0)) s"
  return $rc
}

status=0
for s in "${sanitizers[@]}"; do
  run_one "$s" || status=1
done
exit $status
