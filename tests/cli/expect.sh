#!/usr/bin/env bash
# expect.sh pass|fail [REGEX|!REGEX]... -- COMMAND [ARGS...]
#
# Runs COMMAND and passes when its exit status is 0 (pass) or not 0 (fail) AND its output (stdout
# and stderr together) matches every REGEX (grep -E) and none of the !REGEX. ctest's
# PASS_REGULAR_EXPRESSION would ignore the exit status; the `accel` subcommands promise both output and an
# exit code, so both are checked here.
set -u
mode=$1
shift
pats=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  pats+=("$1")
  shift
done
if [ $# -eq 0 ]; then
  echo "usage: expect.sh pass|fail [REGEX|!REGEX]... -- COMMAND [ARGS...]" >&2
  exit 2
fi
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
echo "---- exit status: $rc (expected: $mode)"
case $mode in
  pass) [ "$rc" -eq 0 ] || { echo "FAILED: expected exit status 0"; exit 1; } ;;
  fail) [ "$rc" -ne 0 ] || { echo "FAILED: expected a non-zero exit status"; exit 1; } ;;
  *) echo "unknown mode '$mode' (pass or fail)" >&2; exit 2 ;;
esac
for p in "${pats[@]}"; do
  if [ "${p:0:1}" = "!" ]; then
    if printf '%s\n' "$out" | grep -Eq -- "${p:1}"; then
      echo "FAILED: output matches /${p:1}/ but must not"
      exit 1
    fi
  elif ! printf '%s\n' "$out" | grep -Eq -- "$p"; then
    echo "FAILED: output lacks /$p/"
    exit 1
  fi
done
echo "---- as expected"
