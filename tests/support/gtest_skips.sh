#!/usr/bin/env bash
# gtest_skips.sh COMMAND [ARGS...] — runs a GoogleTest command (a binary, or mpirun around one) and
# exits 77 (ctest's SKIP_RETURN_CODE: skipped) only when it exited 0 and its summary counts skipped
# tests ("[  SKIPPED ] N test"). Any other status is passed through (a 77 of its own becomes 1), so a
# run where one test skipped and another failed is a failure, never "skipped".
set -u
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 0 ] && grep -Eq '^\[  SKIPPED \] [1-9][0-9]* tests?,' "$log"; then
  echo "---- gtest_skips: exit 0 with skipped tests: reported as skipped (77)"
  exit 77
fi
[ "$rc" -eq 77 ] && { echo "---- gtest_skips: the command itself exited 77: reported as a failure"; exit 1; }
exit "$rc"
