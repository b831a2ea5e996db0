#!/usr/bin/env bash
# accel under the sanitizers: builds the library and the comm/sharding test binaries with
# ThreadSanitizer (build-tsan/) and with AddressSanitizer + UBSan (build-asan/), then runs every comm
# and sharding test at 2-4 ranks under mpirun (ctest). Fails on a failing test or on any sanitizer
# report from any rank. libtorch and Open MPI are not instrumented; what that means for the runtime
# options and the suppressions is explained in scripts/sanitizers/.
#
#   scripts/sanitize.sh                  both sanitizers, thread first
#   scripts/sanitize.sh thread|address   one of them
# Environment:
#   ACCEL_SANITIZE_TESTS  ctest regex of the tests to run (default: comm and sharding tests at 2-4 ranks)
#   ACCEL_CACHE           where scripts/setup.sh put the torch venv (default ~/.cache/accel)
#   JOBS                  build parallelism (default 2)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SAN_DIR=$ROOT/scripts/sanitizers
VENV=${ACCEL_CACHE:-$HOME/.cache/accel}/venv-torch-2.11.0
JOBS=${JOBS:-2}
# Test names are <prefix>_np<N> (tests/support/AccelTests.cmake): every comm_* and sharding_* test at
# 2, 3 or 4 ranks, whatever tests a later comm transport adds (the *_CUDA ones end in _CUDA: left out).
TESTS=${ACCEL_SANITIZE_TESTS:-'^(comm|sharding)(_[a-z0-9_]+)?_np[234]$'}

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

# Runtime options per sanitizer (each one's reason in scripts/sanitizers/README.md). Reports go to
# files under $LOGS (log_path: one file per process), so a rank's report is seen even where a test
# asserts its own exit status (the fault tests expect a rank to fail).
set_options() {  # set_options SANITIZER LOGS
  local logs=$2
  unset TSAN_OPTIONS ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
  case $1 in
    thread)
      export TSAN_OPTIONS="ignore_noninstrumented_modules=1 report_signal_unsafe=0 second_deadlock_stack=1
        suppressions=$SAN_DIR/tsan.supp log_path=$logs/tsan"
      ;;
    address)
      export ASAN_OPTIONS="detect_leaks=1 detect_stack_use_after_return=1 check_initialization_order=1
        strict_init_order=1 detect_odr_violation=0 log_path=$logs/asan"
      export LSAN_OPTIONS="suppressions=$SAN_DIR/lsan.supp print_suppressions=0"
      export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1 suppressions=$SAN_DIR/ubsan.supp log_path=$logs/ubsan"
      ;;
  esac
}

reports() { find "$1" -type f -size +0c | sort; }

# The executables the selected tests run, by their CMake target names (read from ctest's own
# description of the tests, so no list of test files or sources lives here).
test_targets() {  # test_targets BUILD
  ctest --test-dir "$1" -R "$TESTS" --show-only=json-v1 | "$VENV/bin/python" -c '
import json, os, sys
build = os.path.realpath(sys.argv[1]) + "/bin/"
names = set()
for t in json.load(sys.stdin).get("tests", []):
    for arg in t.get("command", []):
        if os.path.realpath(arg).startswith(build):
            names.add(os.path.basename(arg))
print(" ".join(sorted(names)))' "$1"
}

run_one() {  # run_one SANITIZER
  local san=$1 build
  case $san in thread) build=$ROOT/build-tsan ;; address) build=$ROOT/build-asan ;; esac
  local logs=$build/sanitizer-logs
  local t0=$SECONDS

  say "$san: configure $build"
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  # NCCL off: its backend cannot run on a CPU machine and would only cost build time. Examples and
  # benchmarks off: the comm and sharding tests do not run them.
  cmake -S "$ROOT" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DACCEL_SANITIZE="$san" \
    -DACCEL_WITH_NCCL=OFF -DACCEL_BUILD_EXAMPLES=OFF -DACCEL_BUILD_BENCHMARKS=OFF \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DACCEL_PYTHON="$VENV/bin/python" >"$build.configure.log" 2>&1 ||
    { cat "$build.configure.log"; die "$san: configure failed"; }

  local targets
  targets=$(test_targets "$build")
  [ -n "$targets" ] || die "$san: no test matches '$TESTS'"
  say "$san: build $targets accel_sanitizer_canary"
  # shellcheck disable=SC2086
  cmake --build "$build" -j "$JOBS" --target $targets accel_sanitizer_canary

  rm -rf "$logs" && mkdir -p "$logs/canary"
  set_options "$san" "$logs/canary"
  say "$san: canary (a deliberate bug must be reported under these options)"
  local modes=(race)
  [ "$san" = address ] && modes=(overflow shift)
  for m in "${modes[@]}"; do
    "$build/bin/accel_sanitizer_canary" "$m" >/dev/null 2>&1 || true
    grep -lqE "ThreadSanitizer: data race|AddressSanitizer: heap-buffer-overflow|runtime error: shift exponent" \
      "$logs"/canary/* 2>/dev/null || die "$san: the canary's '$m' bug was not reported: the options hide reports"
    echo "canary $m: reported"
    rm -f "$logs"/canary/*
  done

  set_options "$san" "$logs"
  say "$san: ctest -R '$TESTS'"
  local rc=0
  ctest --test-dir "$build" -R "$TESTS" --output-on-failure || rc=$?
  local found
  found=$(reports "$logs" | grep -v /canary/ || true)
  if [ -n "$found" ]; then
    for f in $found; do echo "---- $f"; cat "$f"; done
    echo "$san: $(wc -w <<<"$found") process(es) reported errors (above)"
    rc=1
  fi
  echo "$san: $([ $rc -eq 0 ] && echo PASS || echo FAIL) in $((SECONDS - t0)) s"
  return $rc
}

status=0
for s in "${sanitizers[@]}"; do
  run_one "$s" || status=1
done
exit $status
