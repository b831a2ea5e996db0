#!/usr/bin/env bash
# Runs a command that must fail: passes only if it exits non-zero and its stderr matches a regex.
# Usage: estimate_memory_expect_fail.sh REGEX COMMAND [ARGS...]
set -u
if [ $# -lt 2 ]; then
  echo "usage: $0 REGEX COMMAND [ARGS...]" >&2
  exit 2
fi
regex=$1
shift
err=$(mktemp)
trap 'rm -f "$err"' EXIT
"$@" >/dev/null 2>"$err"
rc=$?
echo "command: $*"
echo "exit code: $rc"
echo "stderr:"
cat "$err"
if [ "$rc" -eq 0 ]; then
  echo "FAIL: expected a non-zero exit code" >&2
  exit 1
fi
if ! grep -Eq -- "$regex" "$err"; then
  echo "FAIL: stderr does not match /$regex/" >&2
  exit 1
fi
echo "PASS"
